"""The moves a TextArena observation offers, read from its text, so a random player makes well-formed moves.

TextArena games state their moves in the game's own words: "Available Moves: '[0]', '[1]'",
"Valid moves: [Up], [Down]", "Available Moves: up, down, left, right" (Sokoban, whose format is
"[up]"), "Your options: [draw], [take]", "Your possible actions: '[check]', '[bet X]'", or only by
example ("enter the column number ... For example: '[col 4]'"). `legal_moves(text)` reads, in order:
1. the last line that lists moves (available/valid/legal/possible moves, actions, targets; your
   options), with the lines under it when it ends in a colon; bracketed items as they are, a plain
   comma list wrapped in brackets; placeholders ("X", "N") filled with 1;
2. else every bracketed token of the latest instructions that is not a speaker tag ("[GAME]",
   "[Player 0]") or a description of the format itself.
`variants(...)` draws more moves of the same form, which the game adapter tries on a copy of the game
(`TextArenaGame.legal_moves`), keeping the ones the game accepts.
"""

from __future__ import annotations

import random
import re

_LIST_LINE = re.compile(
    r"(?i)\b(?:(?:available|valid|legal|possible)\s+(?:moves?|actions?|targets?|commands?)|your options)\b[^:\n]{0,40}:"
)
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,40})\]")
_NOT_MOVES = re.compile(
    r"^(player \d+|game|gamemaster|moderator|you|valid moves?.*|x|o|\s*|.*\.\.\..*|row col|from to|a,b|.*\bpts\b.*)$",
    re.IGNORECASE,
)
_PLACEHOLDER = re.compile(r"(?<=[a-z] )(?:X|N|Y|amount|number|qty)\b|<[^<>]+>|(?<=\$)X\b")  # bet X, <number>, $X
_TAIL = 2500  # characters: the latest instructions list the moves that are open now


def legal_moves(text: str) -> list[str]:
    """The moves `text` offers, as the game wants them written (with brackets); [] when it names none."""
    tail = text[-_TAIL:]
    listed = _listed(tail)
    if listed:
        return listed
    for part in (tail, text):  # the latest instructions, else the rules at the start (a long board pushes them out)
        found = _unique(f"[{_fill(m.strip())}]" for m in _BRACKETED.findall(part) if not _NOT_MOVES.match(m.strip()))
        if found:
            return found
    return []


def listed_moves(text: str) -> list[str]:
    """The moves of the last line of `text` that lists the open moves ("Available Moves: ..."); [] when none does."""
    return _listed(text[-_TAIL:])


def _listed(tail: str) -> list[str]:
    """The moves of the last line that lists them (and the lines under it, when it ends in a colon)."""
    matches = list(_LIST_LINE.finditer(tail))
    if not matches:
        return []
    last = matches[-1]
    line_end = tail.find("\n", last.end())
    rest = tail[last.end() : line_end if line_end >= 0 else None]
    if not rest.strip() and line_end >= 0:  # "Available actions:" and the moves on the lines below
        below = []
        for line in tail[line_end + 1 :].splitlines()[:12]:
            if not line.strip():
                break
            below.append(line)
        rest = " ".join(below)
    bracketed = [m.strip() for m in _BRACKETED.findall(rest)]
    if bracketed:
        return _unique(f"[{_fill(m)}]" for m in bracketed if not _NOT_MOVES.match(m))
    words = re.split(r",|\bor\b|/|\|", re.sub(r"\([^)]*\)", "", rest))
    plain = [w.strip(" '\"`.;") for w in words]
    return _unique(f"[{w}]" for w in plain if w and len(w) <= 30 and not _NOT_MOVES.match(w))


def _fill(move: str) -> str:
    """A move with its placeholders filled in ("bet X" -> "bet 1")."""
    return _PLACEHOLDER.sub("1", move)


def _unique(moves: object) -> list[str]:
    return list(dict.fromkeys(moves))  # type: ignore[call-overload]


_DIGITS = re.compile(r"\d+")
_BOARD_LETTER = re.compile(r"(?<![A-Za-z])[a-h](?=\d)")  # the file of a board square ("b3")
_CAPITAL = re.compile(r"(?<![A-Za-z])[A-Z](?![A-Za-z])")


def variants(moves: list[str], text: str, rng: random.Random, count: int) -> list[str]:
    """`count` moves in the form of `moves`, with their numbers, board files and one-letter words redrawn.

    A game that shows one example ("[col 4]", "[0 3]", "[b1b3]") rather than its open moves gets
    candidates of the same form; the caller keeps those the game accepts.
    """
    capitals = sorted(set(_CAPITAL.findall(text))) or ["A"]
    top = max([9, *(int(n) for n in _DIGITS.findall(text[-_TAIL:]) if len(n) <= 3)])
    out = []
    for _ in range(count):
        move = rng.choice(moves)
        move = _DIGITS.sub(lambda m: str(rng.randint(0, top if int(m.group()) > 9 else 9)), move)
        move = _BOARD_LETTER.sub(lambda m: rng.choice("abcdefgh"), move)
        move = _CAPITAL.sub(lambda m: rng.choice(capitals), move)
        out.append(_SQUARES.sub(lambda m: _step_from(m, rng), move))
    return out


_SQUARES = re.compile(r"(?<![A-Za-z])([a-h])([1-9])(\s*)([a-h])([1-9])(?!\d)")  # "a2a3", "b1 c3": from and to


def _step_from(match: re.Match[str], rng: random.Random) -> str:
    """A from-to move whose target lies at most two squares from its start: board games move pieces a short way,
    so these are far likelier legal than two squares drawn apart."""
    col, row = ord(match[1]) - ord("a"), int(match[2])
    to_col = min(max(col + rng.randint(-2, 2), 0), 7)
    to_row = min(max(row + rng.randint(-2, 2), 1), 9)
    return f"{match[1]}{match[2]}{match[3]}{chr(ord('a') + to_col)}{to_row}"
