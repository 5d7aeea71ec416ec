"""FrozenLake as text: walk from S to G across a frozen lake without stepping into a hole.

Maps come from the seed (holes drawn with probability `hole_fraction`, redrawn until a path from
start to goal exists). On slippery ice a move goes the intended way with probability 1/3 and to
each perpendicular side with 1/3, as in gymnasium's FrozenLake; moving off the edge stays put.

The anchor (`info["anchor"]`) is a digest of the map (and of the ice: slippery or not) and the player's square,
e.g. `map=5be0d7c1a2f3e499|pos=1,2`; a hole or the goal has one too (the episode is over there).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Literal

from envhub.core import state_digest
from envhub.envs.directions import DIRECTIONS, GridToolEnv
from envhub.errors import ResetNeeded
from envhub.tools import tool

PERPENDICULAR = {"up": ("left", "right"), "down": ("left", "right"), "left": ("up", "down"), "right": ("up", "down")}
LEGEND = "Legend: S start, F frozen ice (safe), H hole (you fall in and lose), G goal, P you."

Cell = tuple[int, int]


def _distance(a: Cell, b: Cell) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


class FrozenLakeEnv(GridToolEnv):
    """Reach the goal G from the start S on a generated lake without falling into a hole H.

    Reward: 1.0 on reaching the goal, 0.0 otherwise (falling into a hole ends the episode with 0.0).
    With `slippery=True` each move goes the intended way with probability 1/3 and to either side
    with 1/3 each. `info` carries `success`, `fell`, `position` (row, col), `invalid_action`, `anchor`
    and, on slippery ice, `slipped`.

    `spaced=True` draws the grid with a space between cells ("P F H"). Compact rows ("PFH") are what gymnasium's
    FrozenLake prints, but a BPE tokenizer merges them into multi-cell tokens (SmolLM2: "PFF" -> "P", "FF"), so a
    model cannot tell which column a hole is in; spaced, every cell is one token.

    `neighbours=True` adds a line naming the four squares next to the player ("Next to you: up the edge, down ice,
    left the edge, right a hole."), as text suites such as BabyAI describe what is in front of the agent. The
    grid stays; what the line adds is the reading a small model fails at: SmolLM2-135M fine-tuned on 96 solver
    episodes of 3x3 lakes with 40% holes solved 0.33 of held-out lakes greedily, under the 0.39 that replaying one
    fixed move sequence solves, where reading one square ahead solves 0.87 (`benchmarks/frozen_lake_ceilings.py`).
    """

    system_prompt = (
        "You are crossing a frozen lake drawn as a grid. Walk from S to the goal G, one square per turn, "
        "without stepping into a hole H. "
        'Reply with one move: a tool call <tool_call>{"name": "move", "arguments": {"direction": "down"}}</tool_call>, '
        "or just the word up, down, left or right (the last direction word in your reply is used)."
    )
    reward_doc = (
        "1.0 on reaching the goal G (episode ends), 0.0 otherwise; falling into a hole ends the episode with 0.0."
    )

    def __init__(
        self,
        size: int = 4,
        hole_fraction: float = 0.2,
        slippery: bool = False,
        spaced: bool = False,
        neighbours: bool = False,
        random_ends: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if size < 2:
            raise ValueError(f"FrozenLake size must be at least 2, got {size}")
        if not 0.0 <= hole_fraction < 1.0:
            raise ValueError(f"hole_fraction must be in [0, 1), got {hole_fraction}")
        self.size = size
        self.hole_fraction = hole_fraction
        self.slippery = slippery
        self.spaced = spaced
        self.neighbours = neighbours
        self.random_ends = random_ends
        self.render_mode = render_mode
        self.grid: list[str] = []
        self.position: Cell | None = None
        self.start: Cell = (0, 0)
        self.goal: Cell = (size - 1, size - 1)
        self._map_digest = ""
        self._policy: dict[Cell, str] | None = None
        self._values: dict[Cell, float] = {}
        self._moved_at = 0  # the step whose action made a move (others were invalid)
        self._slipped = False

    # -- episode -------------------------------------------------------------------------------
    @tool
    def move(self, direction: Literal["up", "down", "left", "right"]) -> str:
        """Walk one square on the lake.

        Args:
            direction: Where to walk: up, down, left or right.
        """
        assert self.position is not None
        actual = direction
        if self.slippery:
            actual = [direction, *PERPENDICULAR[direction]][int(self.np_random.integers(3))]
        target = self._neighbour(self.position, actual)
        message = f"You tried to go {direction}" + (f" but slipped {actual}" if actual != direction else "")
        message += " and bumped into the edge of the lake, staying where you were." if target == self.position else "."
        self.position, self._moved_at, self._slipped = target, self.steps, actual != direction
        tile = self.grid[target[0]][target[1]]
        if tile == "H":
            return self.finish(message + " You fell into a hole. Game over.")
        if tile == "G":
            return self.finish(message + " You reached the goal!", reward=1.0)
        return message

    tools = (move,)

    def setup(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rng = random.Random(int(self.np_random.integers(2**63)))
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        for _ in range(10_000):
            grid = [["F"] * self.size for _ in range(self.size)]
            for r in range(self.size):
                for c in range(self.size):
                    if rng.random() < self.hole_fraction:
                        grid[r][c] = "H"
            if self.random_ends:
                self.start = rng.choice(cells)
                far = [cell for cell in cells if _distance(cell, self.start) >= self.size - 1]
                self.goal = rng.choice(far)
            (sr, sc), (gr, gc) = self.start, self.goal
            grid[sr][sc], grid[gr][gc] = "S", "G"
            self.grid = ["".join(row) for row in grid]
            if self._shortest_path(self.start) is not None:
                break
        else:
            raise RuntimeError(
                f"no {self.size}x{self.size} map with a path to the goal in 10000 draws; lower "
                f"hole_fraction={self.hole_fraction}"
            )
        self.position, self._policy, self._moved_at = self.start, None, 0
        self._map_digest = state_digest([self.grid, self.slippery])
        obs = f"A new {self.size}x{self.size} lake{' (slippery ice!)' if self.slippery else ''}.\n{self.render_text()}"
        return obs, self._info(invalid=False)

    def step_info(self) -> dict[str, Any]:
        info = self._info(invalid=self._moved_at != self.steps)
        if self.slippery and self._moved_at == self.steps:
            info["slipped"] = self._slipped
        return info

    def anchor(self) -> str | None:
        """The map's digest and the player's square."""
        if self.position is None:
            return None
        return f"map={self._map_digest}|pos={self.position[0]},{self.position[1]}"

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
        separator = " " if self.spaced else ""
        rows = [
            separator.join("P" if (r, c) == self.position else tile for c, tile in enumerate(row))
            for r, row in enumerate(self.grid)
        ]
        r, c = self.position
        under = {"S": "the start", "F": "ice", "H": "a hole", "G": "the goal"}
        text = "\n".join(rows) + f"\n{LEGEND}\nYou are at row {r}, column {c} (0-based), on {under[self.grid[r][c]]}."
        if self.random_ends:
            text += f" The goal is at row {self.goal[0]}, column {self.goal[1]}."
        if self.neighbours:
            around = []
            for direction in ("up", "down", "left", "right"):
                cell = self._neighbour(self.position, direction)
                around.append(
                    f"{direction} " + ("the edge" if cell == self.position else under[self.grid[cell[0]][cell[1]]])
                )
            text += f"\nNext to you: {', '.join(around)}."
        return text

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

    def _value_iteration(
        self, discount: float = 0.999, tolerance: float = 1e-12
    ) -> tuple[dict[Cell, str], dict[Cell, float]]:
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
