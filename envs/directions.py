"""Grid moves (up, down, left, right) and reading one from a plain-text reply, shared by the grid games."""

from __future__ import annotations

import re

from envhub.toolenv import ToolEnv

DIRECTIONS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
MAX_ACTION_CHARS = 20_000
_DIRECTION_WORD = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
_ASK = "Reply with one direction: up, down, left or right."


def direction_word(text: str) -> tuple[str | None, str]:
    """The last direction word of a plain-text reply, or None and why not."""
    if len(text) > MAX_ACTION_CHARS:
        return None, f"Your reply is {len(text)} characters long; the limit is {MAX_ACTION_CHARS}. {_ASK}"
    words = _DIRECTION_WORD.findall(text)
    if not words:
        shown = text.strip()[:60] or "(empty)"
        return None, f"No move found in your reply {shown!r}. {_ASK}"
    return words[-1].lower(), ""


class GridToolEnv(ToolEnv):
    """A grid game played with a `move(direction)` tool; a reply without a tool call moves by its last direction
    word."""

    def on_text(self, text: str) -> str:
        """A reply without a tool call: its last direction word is the move."""
        direction, problem = direction_word(text)
        return problem if direction is None else self.move.function(self, direction)  # type: ignore[attr-defined]

    def observe(self, text: str) -> str:
        return f"{text}\n\n{self.render_text()}"


GridToolEnv.__abstract__ = True  # type: ignore[attr-defined]
