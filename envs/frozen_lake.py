"""FrozenLake as text: walk from S to G across a frozen lake without stepping into a hole.

Maps come from the seed (holes drawn with probability `hole_fraction`, redrawn until a path from
start to goal exists). On slippery ice a move goes the intended way with probability 1/3 and to
each perpendicular side with 1/3, as in gymnasium's FrozenLake; moving off the edge stays put.
"""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any, Literal

from envhub.core import AgentEnv
from envhub.errors import ResetNeeded
from envhub.toolcalls import parse_tool_calls
from envhub.tools import tool

DIRECTIONS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
PERPENDICULAR = {"up": ("left", "right"), "down": ("left", "right"), "left": ("up", "down"), "right": ("up", "down")}
LEGEND = "Legend: S start, F frozen ice (safe), H hole (you fall in and lose), G goal, P you."
MAX_ACTION_CHARS = 20_000
_DIRECTION_WORD = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)

Cell = tuple[int, int]


@tool
def move(direction: Literal["up", "down", "left", "right"]) -> str:
    """Walk one square on the lake.

    Args:
        direction: Where to walk: up, down, left or right.
    """
    return direction


class FrozenLakeEnv(AgentEnv):
    """Reach the goal G from the start S on a generated lake without falling into a hole H.

    Reward: 1.0 on reaching the goal, 0.0 otherwise (falling into a hole ends the episode with 0.0).
    With `slippery=True` each move goes the intended way with probability 1/3 and to either side
    with 1/3 each. `info` carries `success`, `fell`, `position` (row, col), `invalid_action` and,
    on slippery ice, `slipped`.
    """

    tools = (move,)
    system_prompt = (
        "You are crossing a frozen lake drawn as a grid. Walk from S to the goal G, one square per turn, "
        "without stepping into a hole H. "
        'Reply with one move: a tool call <tool_call>{"name": "move", "arguments": {"direction": "down"}}</tool_call>, '
        "or just the word up, down, left or right (the last direction word in your reply is used)."
    )
    reward_doc = "1.0 on reaching the goal G (episode ends), 0.0 otherwise; falling into a hole ends the episode with 0.0."

    def __init__(self, size: int = 4, hole_fraction: float = 0.2, slippery: bool = False, render_mode: str | None = None) -> None:
        if size < 2:
            raise ValueError(f"FrozenLake size must be at least 2, got {size}")
        if not 0.0 <= hole_fraction < 1.0:
            raise ValueError(f"hole_fraction must be in [0, 1), got {hole_fraction}")
        self.size = size
        self.hole_fraction = hole_fraction
        self.slippery = slippery
        self.render_mode = render_mode
        self.grid: list[str] = []
        self.position: Cell | None = None
        self.done = False
        self._policy: dict[Cell, str] | None = None
        self._values: dict[Cell, float] = {}

    # -- episode -------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        rng = random.Random(int(self.np_random.integers(2**63)))
        for _ in range(10_000):
            grid = [["F"] * self.size for _ in range(self.size)]
            for r in range(self.size):
                for c in range(self.size):
                    if rng.random() < self.hole_fraction:
                        grid[r][c] = "H"
            grid[0][0], grid[-1][-1] = "S", "G"
            self.grid = ["".join(row) for row in grid]
            if self._shortest_path((0, 0)) is not None:
                break
        else:
            raise RuntimeError(f"no {self.size}x{self.size} map with a path to the goal in 10000 draws; lower hole_fraction={self.hole_fraction}")
        self.position, self.done, self._policy = (0, 0), False, None
        obs = f"A new {self.size}x{self.size} lake{' (slippery ice!)' if self.slippery else ''}.\n{self.render_text()}"
        return obs, self.base_info(**self._info(invalid=False))

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.position is None or self.done:
            raise ResetNeeded("step() called before reset() or after the episode ended", hint="call reset() first")
        direction, problem = self._read_action(action)
        if direction is None:
            return f"{problem}\n\n{self.render_text()}", 0.0, False, False, self._info(invalid=True)
        actual = direction
        if self.slippery:
            actual = [direction, *PERPENDICULAR[direction]][int(self.np_random.integers(3))]
        target = self._neighbour(self.position, actual)
        message = f"You tried to go {direction}" + (f" but slipped {actual}" if actual != direction else "")
        if target == self.position:
            message += " and bumped into the edge of the lake, staying where you were."
        else:
            message += "."
        self.position = target
        tile = self.grid[target[0]][target[1]]
        reward, terminated = 0.0, tile in "HG"
        if tile == "H":
            message += " You fell into a hole. Game over."
        elif tile == "G":
            message += " You reached the goal!"
            reward = 1.0
        self.done = terminated
        info = self._info(invalid=False)
        if self.slippery:
            info["slipped"] = actual != direction
        return f"{message}\n\n{self.render_text()}", reward, terminated, False, info

    def _read_action(self, action: Any) -> tuple[str | None, str]:
        """The direction asked for, or None and a message explaining what was wrong."""
        parsed = parse_tool_calls(action, self.tools)
        if parsed.errors:
            return None, parsed.error_message()
        if parsed.calls:
            return str(parsed.calls[-1].arguments["direction"]), ""
        if len(parsed.text) > MAX_ACTION_CHARS:
            return None, f"Your reply is {len(parsed.text)} characters long; the limit is {MAX_ACTION_CHARS}. Reply with one direction: up, down, left or right."
        words = _DIRECTION_WORD.findall(parsed.text)
        if not words:
            shown = parsed.text.strip()[:60] or "(empty)"
            return None, f"No move found in your reply {shown!r}. Reply with one direction: up, down, left or right."
        return words[-1].lower(), ""

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        r, c = self.position  # type: ignore[misc]
        tile = self.grid[r][c]
        return {"success": tile == "G", "fell": tile == "H", "position": (r, c), "invalid_action": invalid}

    def _neighbour(self, cell: Cell, direction: str) -> Cell:
        dr, dc = DIRECTIONS[direction]
        r, c = cell[0] + dr, cell[1] + dc
        return (r, c) if 0 <= r < self.size and 0 <= c < self.size else cell

    # -- rendering -----------------------------------------------------------------------------
    def render_text(self) -> str:
        """The lake as a character grid with P marking the player, the legend and the position."""
        if self.position is None:
            return "(no lake yet: call reset())"
        rows = [
            "".join("P" if (r, c) == self.position else tile for c, tile in enumerate(row)) for r, row in enumerate(self.grid)
        ]
        r, c = self.position
        under = {"S": "the start", "F": "ice", "H": "a hole", "G": "the goal"}[self.grid[r][c]]
        return "\n".join(rows) + f"\n{LEGEND}\nYou are at row {r}, column {c} (0-based), on {under}."

    # -- solvers -------------------------------------------------------------------------------
    def solve(self) -> list[str] | None:
        """A shortest move sequence from the current square to the goal on non-slippery ice; None if none.

        On slippery ice the plan ignores slipping; use `optimal_policy()` there.
        """
        if self.position is None:
            raise ResetNeeded("solve() needs a lake", hint="call reset() first")
        return self._shortest_path(self.position)

    def optimal_policy(self) -> dict[Cell, str]:
        """The move maximising the probability of reaching the goal from each safe square (value iteration)."""
        if self._policy is None:
            self._policy, self._values = self._value_iteration()
        return self._policy

    def success_probability(self) -> float:
        """The probability of reaching the goal from the current square under `optimal_policy()`."""
        self.optimal_policy()
        return self._values.get(self.position, 0.0) if self.position is not None else 0.0

    def oracle_action(self) -> str | None:
        """The solver's next move as text (shortest path, or the optimal policy on slippery ice)."""
        if self.position is None or self.done:
            return None
        if self.slippery:
            return self.optimal_policy().get(self.position)
        plan = self.solve()
        return plan[0] if plan else None

    def _shortest_path(self, start: Cell) -> list[str] | None:
        parents: dict[Cell, tuple[Cell, str] | None] = {start: None}
        queue = deque([start])
        while queue:
            cell = queue.popleft()
            if self.grid[cell[0]][cell[1]] == "G":
                path = []
                while parents[cell] is not None:
                    cell, name = parents[cell]  # type: ignore[misc]
                    path.append(name)
                return path[::-1]
            if self.grid[cell[0]][cell[1]] == "H":
                continue
            for name in DIRECTIONS:
                nxt = self._neighbour(cell, name)
                if nxt not in parents:
                    parents[nxt] = (cell, name)
                    queue.append(nxt)
        return None

    def _outcomes(self, direction: str) -> list[tuple[str, float]]:
        if not self.slippery:
            return [(direction, 1.0)]
        return [(d, 1 / 3) for d in (direction, *PERPENDICULAR[direction])]

    def _value_iteration(self, discount: float = 0.999, tolerance: float = 1e-12) -> tuple[dict[Cell, str], dict[Cell, float]]:
        """Policy from discounted value iteration (the discount breaks ties towards shorter routes,
        so the policy never walks into an edge forever); values are its undiscounted success chance."""
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        safe = [cell for cell in cells if self.grid[cell[0]][cell[1]] in "SF"]
        goal = {cell: 1.0 if self.grid[cell[0]][cell[1]] == "G" else 0.0 for cell in cells}
        policy: dict[Cell, str] = {}

        def sweep(values: dict[Cell, float], gamma: float, fixed: dict[Cell, str] | None) -> float:
            change = 0.0
            for cell in safe:
                best_name, best = "up", -1.0
                for name in (fixed[cell],) if fixed else DIRECTIONS:  # ties keep the first direction
                    value = gamma * sum(p * values[self._neighbour(cell, d)] for d, p in self._outcomes(name))
                    if value > best + 1e-15:
                        best_name, best = name, value
                change = max(change, abs(best - values[cell]))
                values[cell] = best
                if fixed is None:
                    policy[cell] = best_name
            return change

        discounted = dict(goal)
        while sweep(discounted, discount, None) > tolerance:
            pass
        success = dict(goal)
        for _ in range(100_000):
            if sweep(success, 1.0, policy) < tolerance:
                break
        return policy, success
