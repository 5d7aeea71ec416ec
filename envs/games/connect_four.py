"""ConnectFour as a PettingZoo AEC env with text observations, and an alpha-beta player.

Moves are column numbers 1-7 (a letter A-G also works). Red (player_0) moves first. Reward: +1 win,
-1 loss, 0 draw. The strong player searches `depth` plies with negamax and alpha-beta pruning,
scoring leaves by open lines; it always takes a win in one and blocks a loss in one.
"""

from __future__ import annotations

import re

import numpy as np

from envhub.envs.games.base import TurnGame

ROWS, COLS = 6, 7
DISCS = ("R", "Y")
CENTRE_ORDER = (3, 2, 4, 1, 5, 0, 6)
WIN_SCORE = 1_000_000
_COLUMN = re.compile(r"^\s*(?:column\s*|col\s*)?([1-7a-g])\s*\.?\s*$", re.IGNORECASE)


def _windows() -> list[tuple[int, ...]]:
    cells = []
    for r in range(ROWS):
        for c in range(COLS):
            for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                if 0 <= r + 3 * dr < ROWS and 0 <= c + 3 * dc < COLS:
                    cells.append(tuple((r + k * dr) * COLS + c + k * dc for k in range(4)))
    return cells


WINDOWS = _windows()  # 69 lines of four cells, as flat indices (row 0 is the top)


class ConnectFourEnv(TurnGame):
    """Drop discs into a 6x7 grid; four in a row (any direction) wins."""

    metadata = {**TurnGame.metadata, "name": "connect_four_v0"}
    num_actions = COLS
    observation_shape = (ROWS * COLS,)
    move_help = 'a column number 1-7, e.g. "4"'

    def __init__(self, render_mode: str | None = None, depth: int = 4) -> None:
        super().__init__(render_mode)
        self.depth = depth

    def _new_state(self) -> None:
        self.cells: list[int] = [-1] * (ROWS * COLS)
        self.heights = [0] * COLS
        self._winner: int | None = None

    def current_seat(self) -> int:
        return len(self.history) % 2

    def legal_actions(self) -> list[int]:
        if self._outcome() is not None:
            return []
        return [c for c in range(COLS) if self.heights[c] < ROWS]

    def _apply(self, action: int) -> None:
        seat = self.current_seat()
        index = self._drop(action, seat)
        if self._wins_at(index, seat):
            self._winner = seat

    def _drop(self, col: int, seat: int) -> int:
        index = (ROWS - 1 - self.heights[col]) * COLS + col
        self.cells[index] = seat
        self.heights[col] += 1
        return index

    def _undo(self, col: int) -> None:
        self.heights[col] -= 1
        self.cells[(ROWS - 1 - self.heights[col]) * COLS + col] = -1

    def _wins_at(self, index: int, seat: int) -> bool:
        r, c = divmod(index, COLS)
        for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
            count = 1
            for sign in (1, -1):
                rr, cc = r + sign * dr, c + sign * dc
                while 0 <= rr < ROWS and 0 <= cc < COLS and self.cells[rr * COLS + cc] == seat:
                    count += 1
                    rr, cc = rr + sign * dr, cc + sign * dc
            if count >= 4:
                return True
        return False

    def _outcome(self) -> tuple[float, float] | None:
        if self._winner is not None:
            return (1.0, -1.0) if self._winner == 0 else (-1.0, 1.0)
        if all(h == ROWS for h in self.heights):
            return (0.0, 0.0)
        return None

    def move_name(self, action: int) -> str:
        return str(action + 1)

    def parse_move(self, text: str) -> int | None:
        match = _COLUMN.match(text)
        if match is None:
            return None
        token = match.group(1).lower()
        return int(token) - 1 if token.isdigit() else "abcdefg".index(token)

    def seat_name(self, seat: int) -> str:
        return f"{DISCS[seat]} (player_{seat})"

    def board_text(self, seat: int) -> str:
        rows = [
            " ".join(DISCS[v] if v != -1 else "." for v in self.cells[r * COLS : (r + 1) * COLS]) for r in range(ROWS)
        ]
        return "\n".join(rows + [" ".join(str(c + 1) for c in range(COLS))])

    def position(self, seat: int) -> str:
        return "board=" + "".join(DISCS[v] if v != -1 else "." for v in self.cells)

    def observe_array(self, seat: int) -> np.ndarray:
        return np.array([0 if v == -1 else 1 if v == seat else 2 for v in self.cells], dtype=np.int8)

    # -- players ------------------------------------------------------------------------------
    def _immediate(self, seat: int) -> list[int]:
        """Columns where `seat` would complete four right now."""
        wins = []
        for col in range(COLS):
            if self.heights[col] < ROWS:
                index = self._drop(col, seat)
                if self._wins_at(index, seat):
                    wins.append(col)
                self._undo(col)
        return wins

    def scripted_action(self, rng: np.random.Generator) -> int:
        """Win if possible, else block, else the most central open column."""
        me = self.current_seat()
        for seat in (me, 1 - me):
            wins = self._immediate(seat)
            if wins:
                return wins[0]
        return next(c for c in CENTRE_ORDER if self.heights[c] < ROWS)

    def solver_action(self, rng: np.random.Generator) -> int:
        """Negamax with alpha-beta to `depth` plies; ties go to the more central column."""
        me = self.current_seat()
        wins = self._immediate(me)
        if wins:
            return wins[0]
        best_col, best = -1, -WIN_SCORE * 10
        alpha, beta = -WIN_SCORE * 10, WIN_SCORE * 10
        for col in CENTRE_ORDER:
            if self.heights[col] == ROWS:
                continue
            index = self._drop(col, me)
            score = -self._negamax(1 - me, self.depth - 1, -beta, -alpha, index)
            self._undo(col)
            if score > best:
                best_col, best = col, score
            alpha = max(alpha, score)
        return best_col

    def _negamax(self, seat: int, depth: int, alpha: int, beta: int, last: int) -> int:
        if self._wins_at(last, 1 - seat):
            return -WIN_SCORE - depth  # the opponent just won: sooner is worse
        if all(h == ROWS for h in self.heights):
            return 0
        if depth == 0:
            return self._evaluate(seat)
        value = -WIN_SCORE * 10
        for col in CENTRE_ORDER:
            if self.heights[col] == ROWS:
                continue
            index = self._drop(col, seat)
            value = max(value, -self._negamax(1 - seat, depth - 1, -beta, -alpha, index))
            self._undo(col)
            alpha = max(alpha, value)
            if alpha >= beta:
                break
        return value

    def _evaluate(self, seat: int) -> int:
        score = 0
        cells = self.cells
        for window in WINDOWS:
            mine = theirs = 0
            for i in window:
                v = cells[i]
                if v == seat:
                    mine += 1
                elif v != -1:
                    theirs += 1
            if theirs == 0:
                score += (0, 1, 4, 32, 0)[mine]
            elif mine == 0:
                score -= (0, 1, 4, 32, 0)[theirs]
        return score
