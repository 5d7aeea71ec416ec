"""TicTacToe as a PettingZoo AEC env with text observations, and a perfect minimax player.

Cells are written column letter + row number ("B2" is the centre); a bare digit 1-9 counts the
cells row by row from the top left. X (player_0) moves first. Reward: +1 win, -1 loss, 0 draw.
"""

from __future__ import annotations

import re
from functools import cache

import numpy as np

from envhub.envs.games.base import TurnGame

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
MARKS = ("X", "O")
_CELL = re.compile(r"\b([abc])\s*([123])\b|\b([123])\s*([abc])\b|^\s*([1-9])\s*$", re.IGNORECASE)


def winner(board: tuple[int, ...]) -> int | None:
    """The seat (0 or 1) with three in a line, or None. Cells hold -1 (empty), 0 or 1."""
    for a, b, c in LINES:
        if board[a] != -1 and board[a] == board[b] == board[c]:
            return board[a]
    return None


@cache
def minimax_value(board: tuple[int, ...], to_move: int) -> int:
    """Game value for the seat to move under perfect play: 1 win, 0 draw, -1 loss."""
    won = winner(board)
    if won is not None:
        return 1 if won == to_move else -1
    empty = [i for i, v in enumerate(board) if v == -1]
    if not empty:
        return 0
    return max(-minimax_value(board[:i] + (to_move,) + board[i + 1 :], 1 - to_move) for i in empty)


def best_moves(board: tuple[int, ...], to_move: int) -> list[int]:
    """Every cell that keeps the perfect value for the seat to move."""
    empty = [i for i, v in enumerate(board) if v == -1]
    values = {i: -minimax_value(board[:i] + (to_move,) + board[i + 1 :], 1 - to_move) for i in empty}
    best = max(values.values())
    return [i for i in empty if values[i] == best]


class TicTacToeEnv(TurnGame):
    """Three in a row on a 3x3 board; X (player_0) against O (player_1)."""

    metadata = {**TurnGame.metadata, "name": "tictactoe_v0"}
    num_actions = 9
    observation_shape = (9,)
    move_help = 'a cell as column letter + row number, e.g. "B2"'

    def _new_state(self) -> None:
        self.board: list[int] = [-1] * 9

    def current_seat(self) -> int:
        return len(self.history) % 2

    def legal_actions(self) -> list[int]:
        if self._outcome() is not None:
            return []
        return [i for i, v in enumerate(self.board) if v == -1]

    def _apply(self, action: int) -> None:
        self.board[action] = self.current_seat()

    def _outcome(self) -> tuple[float, float] | None:
        won = winner(tuple(self.board))
        if won is not None:
            return (1.0, -1.0) if won == 0 else (-1.0, 1.0)
        if -1 not in self.board:
            return (0.0, 0.0)
        return None

    def move_name(self, action: int) -> str:
        return "ABC"[action % 3] + str(action // 3 + 1)

    def parse_move(self, text: str) -> int | None:
        match = _CELL.search(text.strip())
        if match is None:
            return None
        if match.group(5):
            return int(match.group(5)) - 1
        col, row = (match.group(1), match.group(2)) if match.group(1) else (match.group(4), match.group(3))
        return (int(row) - 1) * 3 + "abc".index(col.lower())

    def seat_name(self, seat: int) -> str:
        return f"{MARKS[seat]} (player_{seat})"

    def board_text(self, seat: int) -> str:
        rows = ["   A B C"]
        for r in range(3):
            cells = [MARKS[v] if v != -1 else "." for v in self.board[3 * r : 3 * r + 3]]
            rows.append(f"{r + 1}  " + " ".join(cells))
        return "\n".join(rows)

    def position(self, seat: int) -> str:
        return "board=" + "".join(MARKS[v] if v != -1 else "." for v in self.board)

    def observe_array(self, seat: int) -> np.ndarray:
        # 1 = own mark, 2 = opponent's, 0 = empty: the same picture from either seat
        return np.array([0 if v == -1 else 1 if v == seat else 2 for v in self.board], dtype=np.int8)

    def solver_action(self, rng: np.random.Generator) -> int:
        moves = best_moves(tuple(self.board), self.current_seat())
        return int(rng.choice(moves))

    def scripted_action(self, rng: np.random.Generator) -> int:
        """Win if possible, else block, else centre, else a corner, else any cell."""
        me, legal = self.current_seat(), self.legal_actions()
        for seat in (me, 1 - me):
            for cell in legal:
                trial = list(self.board)
                trial[cell] = seat
                if winner(tuple(trial)) == seat:
                    return cell
        for preferred in ([4], [0, 2, 6, 8], legal):
            choices = [c for c in preferred if c in legal]
            if choices:
                return int(rng.choice(choices))
        raise RuntimeError("no legal move")  # unreachable while the game goes on
