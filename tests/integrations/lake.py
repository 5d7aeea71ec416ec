"""A FrozenLake policy that reads its prompt, as model text: what the trainer tests put in place of sampling when
the tool path must run (a random tiny model almost never writes a tool call). Plain Python, no pytest: verl_run.py
imports it too."""

from __future__ import annotations

import json
import re
from collections import deque


def move_call(direction: str) -> str:
    """The model's text for one FrozenLake move, in the Hermes form the Qwen2.5 template writes."""
    return "<tool_call>\n" + json.dumps({"name": "move", "arguments": {"direction": direction}}) + "\n</tool_call>"


def solver_reply(env) -> str:
    """What FrozenLake's own solver plays next, as model text (the env is envhub.make's, mid-episode)."""
    return move_call(env.unwrapped.solve()[0])


def lake_move(text: str) -> str | None:
    """The first move of a shortest safe path on the last FrozenLake map drawn in `text` (a decoded conversation);
    None when the map shows the player on the goal or no map is there. A policy that reads its prompt."""
    maps = re.findall(r"((?:^[SFHGP]+\n)+)Legend:", text, re.M)
    if not maps:
        return None
    grid = maps[-1].split()
    cells = {(r, c): tile for r, row in enumerate(grid) for c, tile in enumerate(row)}
    start = next(cell for cell, tile in cells.items() if tile == "P")
    came = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cells[cell] == "G":
            path = []
            while came[cell] is not None:
                cell, move = came[cell]
                path.append(move)
            return path[-1]
        for move, (dr, dc) in {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if cells.get(nxt, "H") != "H" and nxt not in came:
                came[nxt] = (cell, move)
                queue.append(nxt)
    return None
