"""Sokoban: push every box onto a target. Levels come from the seed and are proven solvable.

A level is made by carving a room with a random walk, putting the boxes on their targets, and
playing the game backwards (the player pulls boxes) from that solved state. An exact breadth-first
solver then checks the scrambled level and gives its shortest solution; levels it cannot solve, or
that are too easy, are thrown away and a new one is drawn.

The anchor (`info["anchor"]`) is the player's square and the boxes' squares, with a digest of the static
map (walls and targets), e.g. `map=3f09c2aa41d7e5b0|player=2,3|boxes=2,4;4,4`.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Literal

from envhub.core import state_digest
from envhub.envs.directions import DIRECTIONS, GridToolEnv
from envhub.errors import ResetNeeded
from envhub.tools import tool

WALL, FLOOR = "#", "_"
LEGEND = "Legend: # wall, _ floor, . target, $ box, * box on a target, @ you, + you on a target."


State = tuple[int, frozenset[int]]  # (player cell, box cells), cells as row * width + col


class SokobanEnv(GridToolEnv):
    """Sokoban on a small generated level: push all boxes onto the targets, one move per step.

    Reward: 1.0 on the step that puts the last box on a target (the episode ends), else 0.0. With
    `shaped=True`, each push of a box onto a target also gives +0.1 and each push off one -0.1.
    Invalid moves (into a wall, or pushing a box into a wall or another box) leave the state as it
    is, give 0.0 and say why. `info` carries `success`, `boxes_on_target`, `num_boxes`,
    `invalid_action`, `player` (row, col) and `anchor`.
    """

    system_prompt = (
        "You are playing Sokoban. Push every box ($) onto a target (.). You move one square per turn; "
        "walking into a box pushes it, but you cannot pull boxes or push two at once. "
        'Reply with one move: a tool call <tool_call>{"name": "move", "arguments": {"direction": "left"}}</tool_call>, '
        "or just the word up, down, left or right (the last direction word in your reply is used)."
    )
    reward_doc = (
        "1.0 when every box is on a target (episode ends), else 0.0; shaped=True adds +0.1/-0.1 per box "
        "pushed onto/off a target."
    )

    def __init__(
        self,
        dim: int | tuple[int, int] = (7, 7),
        num_boxes: int = 2,
        scramble_steps: int = 80,
        min_solution_length: int = 6,
        shaped: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if not (
            isinstance(dim, int)
            or (isinstance(dim, (tuple, list)) and len(dim) == 2 and all(isinstance(d, int) for d in dim))
        ):
            raise ValueError(f"Sokoban dim must be an integer or a [height, width] pair, got {dim!r}")
        height, width = (dim, dim) if isinstance(dim, int) else dim
        if height < 4 or width < 4:
            raise ValueError(f"Sokoban dim must be at least 4x4 (walls included), got {height}x{width}")
        if not 1 <= num_boxes <= (height - 2) * (width - 2) // 4:
            raise ValueError(
                f"num_boxes={num_boxes} does not fit a {height}x{width} room; use 1..{(height - 2) * (width - 2) // 4}"
            )
        self.height, self.width = height, width
        self.num_boxes = num_boxes
        self.scramble_steps = scramble_steps
        self.min_solution_length = min_solution_length
        self.shaped = shaped
        self.render_mode = render_mode
        self.walls: frozenset[int] = frozenset()
        self.targets: frozenset[int] = frozenset()
        self.state: State | None = None
        self.optimal_length = 0
        self._map_digest = ""  # walls and targets: fixed for the level, so digested once at reset
        self._moved_at = 0  # the step whose action moved the player (others were invalid)

    # -- episode -------------------------------------------------------------------------------
    @tool
    def move(self, direction: Literal["up", "down", "left", "right"]) -> str:
        """Move one square; walking into a box pushes it one square further.

        Args:
            direction: Where to move: up, down, left or right.
        """
        assert self.state is not None
        player, boxes = self.state
        dr, dc = DIRECTIONS[direction]
        step = dr * self.width + dc
        ahead, beyond = player + step, player + 2 * step
        if ahead in self.walls:
            return f"You cannot move {direction}: a wall is in the way. Nothing changed; try another direction."
        pushed = ahead in boxes
        if pushed:
            if beyond in self.walls or beyond in boxes:
                blocker = "a wall" if beyond in self.walls else "another box"
                return (
                    f"You cannot push the box {direction}: {blocker} is behind it. Nothing changed; try another "
                    f"direction."
                )
            boxes = (boxes - {ahead}) | {beyond}
            if self.shaped:
                self.add_reward(0.1 * ((beyond in self.targets) - (ahead in self.targets)))
        self.state, self._moved_at = (ahead, boxes), self.steps
        message = f"You moved {direction}{' and pushed a box' if pushed else ''}."
        if len(boxes & self.targets) == self.num_boxes:
            return self.finish(message + " Every box is on a target: level solved!", reward=1.0)
        return message

    tools = (move,)

    def setup(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rng = random.Random(int(self.np_random.integers(2**63)))
        for _ in range(1000):
            if self._generate(rng):
                break
        else:  # unreachable for sane sizes; say which knob to turn
            raise RuntimeError(
                f"could not generate a solvable {self.height}x{self.width} level with {self.num_boxes} boxes and a "
                f"solution of at least {self.min_solution_length} moves; lower num_boxes or min_solution_length"
            )
        self._moved_at = 0
        self._map_digest = state_digest([self.height, self.width, sorted(self.walls), sorted(self.targets)])
        obs = "New Sokoban level.\n" + self.render_text()
        return obs, {**self._info(invalid=False), "optimal_length": self.optimal_length}

    def step_info(self) -> dict[str, Any]:
        return self._info(invalid=self._moved_at != self.steps)

    def anchor(self) -> str | None:
        """The map's digest, the player's square and the boxes' squares (row,col; boxes sorted)."""
        if self.state is None:
            return None
        player, boxes = self.state
        cells = ";".join(f"{r},{c}" for r, c in sorted(divmod(box, self.width) for box in boxes))
        row, col = divmod(player, self.width)
        return f"map={self._map_digest}|player={row},{col}|boxes={cells}"

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        player, boxes = self.state  # type: ignore[misc]
        on_target = len(boxes & self.targets)
        return {
            "success": on_target == self.num_boxes,
            "boxes_on_target": on_target,
            "num_boxes": self.num_boxes,
            "invalid_action": invalid,
            "player": divmod(player, self.width),
        }

    # -- rendering -----------------------------------------------------------------------------
    def render_text(self) -> str:
        """The level as a character grid, with the legend and a status line."""
        if self.state is None:
            return "(no level yet: call reset())"
        player, boxes = self.state
        rows = []
        for r in range(self.height):
            row = []
            for c in range(r * self.width, (r + 1) * self.width):
                on_target = c in self.targets
                if c in self.walls:
                    row.append(WALL)
                elif c == player:
                    row.append("+" if on_target else "@")
                elif c in boxes:
                    row.append("*" if on_target else "$")
                else:
                    row.append("." if on_target else FLOOR)
            rows.append("".join(row))
        pr, pc = divmod(player, self.width)
        status = (
            f"Boxes on targets: {len(boxes & self.targets)}/{self.num_boxes}. You are at row {pr}, column {pc} "
            f"(0-based)."
        )
        return "\n".join(rows) + f"\n{LEGEND}\n{status}"

    # -- solver --------------------------------------------------------------------------------
    def solve(self, max_states: int = 500_000) -> list[str] | None:
        """A shortest move sequence solving the level from the current state; None if it cannot be solved."""
        if self.state is None:
            raise ResetNeeded("solve() needs a level", hint="call reset() first")
        return self._shortest_solution(self.state, max_states)

    def oracle_action(self) -> str | None:
        """The first move of a shortest solution, as text; None when there is none."""
        plan = self.solve() if self.state is not None and not self.done else None
        return plan[0] if plan else None

    def _shortest_solution(self, start: State, max_states: int) -> list[str] | None:
        steps = {name: dr * self.width + dc for name, (dr, dc) in DIRECTIONS.items()}
        live = self._live_cells()
        parents: dict[State, tuple[State, str] | None] = {start: None}
        queue = deque([start])
        while queue:
            state = queue.popleft()
            player, boxes = state
            if boxes <= self.targets:
                path = []
                while parents[state] is not None:
                    state, name = parents[state]  # type: ignore[misc]
                    path.append(name)
                return path[::-1]
            for name, step in steps.items():
                ahead = player + step
                if ahead in self.walls:
                    continue
                if ahead in boxes:
                    beyond = ahead + step
                    if beyond in self.walls or beyond in boxes or beyond not in live:
                        continue
                    nxt = (ahead, (boxes - {ahead}) | {beyond})
                else:
                    nxt = (ahead, boxes)
                if nxt not in parents:
                    parents[nxt] = (state, name)
                    queue.append(nxt)
            if len(parents) > max_states:
                return None
        return None

    def _live_cells(self) -> frozenset[int]:
        """Cells from which a box can still reach some target (found by pulling boxes back from targets)."""
        live = set(self.targets)
        queue = deque(self.targets)
        while queue:
            cell = queue.popleft()
            for dr, dc in DIRECTIONS.values():
                step = dr * self.width + dc
                # a box at cell+step pushed by a player at cell+2*step lands on cell
                if cell + step not in self.walls and cell + 2 * step not in self.walls and cell + step not in live:
                    if 0 <= cell + 2 * step < self.height * self.width:
                        live.add(cell + step)
                        queue.append(cell + step)
        return frozenset(live)

    # -- generation ----------------------------------------------------------------------------
    def _generate(self, rng: random.Random) -> bool:
        """Draw one level into self; True if it is solvable and hard enough."""
        h, w = self.height, self.width
        interior = (h - 2) * (w - 2)
        floor: set[int] = set()
        r, c = rng.randrange(1, h - 1), rng.randrange(1, w - 1)
        goal = max(self.num_boxes * 2 + 2, int(interior * 0.6))
        while len(floor) < goal:
            floor.add(r * w + c)
            dr, dc = rng.choice(list(DIRECTIONS.values()))
            if 1 <= r + dr < h - 1 and 1 <= c + dc < w - 1:
                r, c = r + dr, c + dc
        self.walls = frozenset(set(range(h * w)) - floor)
        cells = sorted(floor)
        rng.shuffle(cells)
        self.targets = frozenset(cells[: self.num_boxes])
        boxes = set(self.targets)
        player = cells[self.num_boxes]
        for _ in range(self.scramble_steps):
            dr, dc = rng.choice(list(DIRECTIONS.values()))
            step = dr * w + dc
            ahead, behind = player + step, player - step
            if ahead in self.walls or ahead in boxes:
                continue
            if behind in boxes and rng.random() < 0.8:  # pull the box behind us
                boxes.remove(behind)
                boxes.add(player)
            player = ahead
        start: State = (player, frozenset(boxes))
        if start[1] <= self.targets:
            return False
        solution = self._shortest_solution(start, max_states=200_000)
        if solution is None or len(solution) < self.min_solution_length:
            return False
        self.state, self.optimal_length = start, len(solution)
        return True
