"""Wordle: guess the hidden five-letter word from per-letter feedback.

The hidden word is drawn from the seed out of a word list shipped with the package
(`data/wordle_words.txt`); guesses must come from the same list. Feedback follows the real game,
repeated letters included: greens are marked first, then each remaining letter of the guess is
yellow only while the hidden word still has an unmatched copy of it.

The anchor (`info["anchor"]`) is what the player knows: the (guess, feedback) pairs so far, sorted, so the same
guesses in another order give the same anchor (`guesses=crane:--Y-G;moist:-----`); the pairs are kept as a
multiset, as each guess, repeated or not, uses one up. The hidden word stays out of it: a digest of one of a few
thousand words is no secret, and the episodes a trainer groups share their seed, hence their word.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

from envhub.core import AgentEnv
from envhub.errors import ResetNeeded
from envhub.toolcalls import parse_tool_calls
from envhub.tools import tool

CORRECT, PRESENT, ABSENT = "G", "Y", "-"
WORD_LENGTH = 5
MAX_ACTION_CHARS = 20_000
LEGEND = (
    f"Feedback per letter: {CORRECT} = right letter, right spot; {PRESENT} = in the word, wrong spot; {ABSENT} "
    f"= not in the word."
)
_BRACKETED = re.compile(r"\[\s*([^\[\]\s]*)\s*\]")

History = Sequence[tuple[str, str]]  # (guess, feedback) pairs


@tool
def guess(word: str) -> str:
    """Guess the hidden word.

    Args:
        word: A five-letter English word from the game's word list.
    """
    return word


@lru_cache(maxsize=1)
def word_list() -> tuple[str, ...]:
    """The bundled word list (lowercase five-letter words, sorted)."""
    text = (resources.files("envhub.envs") / "data" / "wordle_words.txt").read_text(encoding="utf-8")
    return tuple(sorted({w for w in text.split() if re.fullmatch(r"[a-z]{5}", w)}))


def feedback(guess: str, answer: str) -> str:
    """Per-letter feedback of `guess` against `answer`, as a string of G / Y / - marks."""
    if guess == answer:
        return CORRECT * WORD_LENGTH
    marks = [ABSENT] * WORD_LENGTH
    unmatched = []  # letters of the answer not matched by a green, each usable for one yellow
    for i in range(WORD_LENGTH):
        if guess[i] == answer[i]:
            marks[i] = CORRECT
        else:
            unmatched.append(answer[i])
    for i in range(WORD_LENGTH):
        if marks[i] == ABSENT and guess[i] in unmatched:
            marks[i] = PRESENT
            unmatched.remove(guess[i])
    return "".join(marks)


def candidates(history: History, words: Sequence[str]) -> list[str]:
    """The words still consistent with every (guess, feedback) pair so far."""
    return list(_candidates(tuple(map(tuple, history)), tuple(words)))


@lru_cache(maxsize=512)
def _candidates(history: tuple[tuple[str, str], ...], words: tuple[str, ...]) -> tuple[str, ...]:
    if not history:
        return words
    # filter the previous turn's candidates (cached), not the whole list, so each turn costs little
    guess, marks = history[-1]
    return tuple(w for w in _candidates(history[:-1], words) if feedback(guess, w) == marks)


@lru_cache(maxsize=4)
def _opener(words: tuple[str, ...]) -> str:
    """A strong first guess: many distinct, frequent letters, often in their usual spots."""
    letters = Counter(ch for w in words for ch in set(w))
    spots = Counter((i, ch) for w in words for i, ch in enumerate(w))
    return max(
        words, key=lambda w: (sum(letters[ch] for ch in set(w)) + sum(spots[i, ch] for i, ch in enumerate(w)) / 2, w)
    )


def solve_step(history: History, words: Sequence[str] | None = None) -> str:
    """The solver's next guess: split the remaining candidates into as many feedback groups as possible."""
    words = tuple(words or word_list())
    if not history:
        return _opener(words)
    left = candidates(history, words)
    if not left:
        raise ValueError("no word in the list fits this feedback; check the history")
    if len(left) <= 2:
        return left[0]
    # a few candidates: any word may split them best; many: choose among the candidates themselves
    pool = words if len(left) <= 8 else left[:50]
    remaining = set(left)
    return max(pool, key=lambda g: (len({feedback(g, w) for w in left}), g in remaining, [-ord(c) for c in g]))


class WordleEnv(AgentEnv):
    """Guess the hidden five-letter word in `max_guesses` tries from G/Y/- feedback.

    Reward: 1.0 when the word is guessed (the episode ends), else 0.0; running out of guesses ends
    the episode with 0.0. Guesses that are not five letters or not in the word list get an
    explanation and do not use up a guess. `info` carries `success`, `guesses_used`,
    `guesses_left`, `invalid_action`, `history` (list of [guess, feedback]) and `anchor`.
    """

    tools = (guess,)
    system_prompt = (
        "You are playing Wordle. Find the hidden five-letter English word. After each guess you get feedback "
        f"for each letter: {CORRECT} = right letter in the right spot, {PRESENT} = the letter is in the word but in "
        f"another spot, "
        f"{ABSENT} = the letter is not in the word (repeated letters are marked as in real Wordle). "
        'Reply with one guess: a tool call <tool_call>{"name": "guess", "arguments": {"word": "crane"}}</tool_call>, '
        "or the word in square brackets like [crane] (or just the word on its own)."
    )
    reward_doc = "1.0 when the hidden word is guessed (episode ends), else 0.0; invalid words do not use up a guess."

    def __init__(self, max_guesses: int = 6, render_mode: str | None = None) -> None:
        if max_guesses < 1:
            raise ValueError(f"max_guesses must be at least 1, got {max_guesses}")
        self.max_guesses = max_guesses
        self.render_mode = render_mode
        self.words = word_list()
        self._allowed = frozenset(self.words)
        self._answer: str | None = None
        self.history: list[tuple[str, str]] = []
        self.done = False

    @property
    def answer(self) -> str:
        """The hidden word (the oracle)."""
        if self._answer is None:
            raise ResetNeeded("there is no hidden word yet", hint="call reset() first")
        return self._answer

    # -- episode -------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._answer = self.words[int(self.np_random.integers(len(self.words)))]
        self.history, self.done = [], False
        obs = (
            f"Guess the hidden five-letter word. You have {self.max_guesses} guesses.\n{LEGEND}\n"
            "Reply with your first guess, e.g. [crane]."
        )
        return obs, self.base_info(**self._info(invalid=False))

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._answer is None or self.done:
            raise ResetNeeded("step() called before reset() or after the game ended", hint="call reset() first")
        word, problem = self._read_action(action)
        if word is None:
            return (
                f"{problem}\nThis did not use up a guess; you still have {self._left()} left.",
                0.0,
                False,
                False,
                self._info(invalid=True),
            )
        marks = feedback(word, self._answer)
        self.history.append((word, marks))
        solved = word == self._answer
        self.done = solved or len(self.history) >= self.max_guesses
        if solved:
            ending = (
                f"You found the word {word.upper()} in {len(self.history)} "
                f"guess{'es' if len(self.history) > 1 else ''}!"
            )
        elif self.done:
            ending = f"You are out of guesses. The word was {self._answer.upper()}."
        else:
            ending = f"You have {self._left()} guess{'es' if self._left() > 1 else ''} left."
        obs = f"{word.upper()}  {' '.join(marks)}\n\n{self.render_text()}\n{ending}"
        return obs, 1.0 if solved else 0.0, self.done, False, self._info(invalid=False)

    def _left(self) -> int:
        return self.max_guesses - len(self.history)

    def _read_action(self, action: Any) -> tuple[str | None, str]:
        """The guessed word, or None and a message explaining what was wrong."""
        parsed = parse_tool_calls(action, self.tools)
        if parsed.errors:
            return None, parsed.error_message()
        if parsed.calls:
            raw = str(parsed.calls[-1].arguments["word"])
        elif len(parsed.text) > MAX_ACTION_CHARS:
            return (
                None,
                f"Your reply is {len(parsed.text)} characters long; the limit is {MAX_ACTION_CHARS}. Reply with one "
                f"word in brackets, e.g. [crane].",
            )
        else:
            bracketed = _BRACKETED.findall(parsed.text)
            alone = parsed.text.strip().strip("\"'`.!*")
            if bracketed:
                raw = bracketed[-1]
            elif alone and re.fullmatch(r"[^\s]+", alone):
                raw = alone
            else:
                shown = parsed.text.strip()[:60] or "(empty)"
                return None, f"No guess found in your reply {shown!r}. Put your guess in square brackets, e.g. [crane]."
        word = raw.strip().lower()
        if not re.fullmatch(r"[a-z]+", word):
            return None, f"{raw[:40]!r} is not a word: use the letters a-z only, e.g. [crane]."
        if len(word) != WORD_LENGTH:
            return None, f"{word.upper()} has {len(word)} letters; guesses must have exactly {WORD_LENGTH}."
        if word not in self._allowed:
            return None, f"{word.upper()} is not in the word list; try another common five-letter English word."
        return word, ""

    def anchor(self) -> str | None:
        """The (guess, feedback) pairs so far, sorted: the knowledge state, whatever order the guesses came in."""
        return "guesses=" + ";".join(sorted(f"{word}:{marks}" for word, marks in self.history))

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        return {
            "success": bool(self.history) and self.history[-1][0] == self._answer,
            "guesses_used": len(self.history),
            "guesses_left": self._left(),
            "invalid_action": invalid,
            "history": [[g, f] for g, f in self.history],
            "anchor": self.anchor(),
        }

    # -- rendering -----------------------------------------------------------------------------
    def render_text(self) -> str:
        """The board: every guess with its feedback, and what is known about the letters."""
        if self._answer is None:
            return "(no game yet: call reset())"
        lines = [f"Board ({len(self.history)}/{self.max_guesses} guesses):"]
        lines += [f"  {g.upper()}  {' '.join(f)}" for g, f in self.history] or ["  (no guesses yet)"]
        found = {g[i] for g, f in self.history for i in range(WORD_LENGTH) if f[i] != ABSENT}
        absent = sorted({g[i] for g, f in self.history for i in range(WORD_LENGTH) if f[i] == ABSENT} - found)
        if found:
            lines.append("Letters in the word: " + " ".join(sorted(found)).upper())
        if absent:
            lines.append("Letters not in the word: " + " ".join(absent).upper())
        lines.append(LEGEND)
        return "\n".join(lines)

    # -- solver --------------------------------------------------------------------------------
    def solve_step(self, history: History | None = None) -> str:
        """The candidate solver's next guess for `history` (default: this game's guesses so far)."""
        return solve_step(self.history if history is None else history, self.words)

    def next_guess(self) -> str:
        """The solver's next guess in the current game."""
        return self.solve_step()

    def oracle_action(self) -> str | None:
        """The solver's next guess as an action, e.g. "[crane]"; None when the game is over."""
        return None if self._answer is None or self.done else f"[{self.next_guess()}]"
