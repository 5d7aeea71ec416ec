"""Math: verifiable word problems generated from the seed, graded by exact answer checking (RLVR).

The problem text and its exact answer (a `Fraction`) come from `envhub.envs.math.problems`. Grading finds the
final answer in the reply (a `submit` call, `\\boxed{...}`, `<answer>...</answer>`, `Answer: ...`,
else the last number) and compares it exactly, so `0.5`, `1/2`, `\\frac{1}{2}`, `2/4`, `x = 1/2`
and `$0.50` all count as the same answer.

The anchor (`info["anchor"]`) is a digest of the problem text, e.g. `problem=0c5e9a41b7d23f86` (`|solved` once
answered right): every attempt answers the same question, so attempts are compared with each other whichever try
they were (the attempts left count turns, and anchors leave turn counters out, as GiGPO leaves out time limits).
The exact answer stays out of the digest, which would otherwise let anyone holding `info` check a guess without
the env.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction
from typing import Any

from envhub.core import AgentEnv, state_digest
from envhub.envs.math.problems import GENERATORS, Problem, format_number, generate
from envhub.errors import ResetNeeded
from envhub.toolcalls import parse_tool_calls
from envhub.tools import submit

MAX_ACTION_CHARS = 50_000
KINDS = ("any", *sorted(GENERATORS))

# a number as people and models write it: -1,234.5 | 3/4 | 1 1/2 | .5
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"
_TOKEN = re.compile(rf"(?:-?\d+\s+\d+\s*/\s*\d+)|(?:(?:{_NUMBER})\s*/\s*(?:{_NUMBER}))|(?:{_NUMBER})")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"(?:final\s+answer|answer)\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)
_HEDGE = re.compile(r"\d\s*(?:,\s+|;|\bor\b|\band\b)\s*(?:[a-z]\s*=\s*)?-?\$?\d")  # "12 or 13", "3, 4": not one answer
_SCIENTIFIC = re.compile(r"-?\d+(?:\.\d+)?[eE][+-]?\d{1,3}")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")


def _boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[begin : i - 1] if depth == 0 else text[begin:]


def extract_answer(text: str) -> str | None:
    """The final-answer part of a reply, by the first marker found; else the last number in it."""
    boxed = _boxed(text)
    if boxed is not None:
        return boxed
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1]
    lines = _ANSWER_LINE.findall(text)
    if lines:
        return lines[-1]
    numbers = _TOKEN.findall(_normalize(text))
    return numbers[-1] if numbers else None


def _normalize(text: str) -> str:
    text = re.sub(r"(\d)\s*(\\[dt]?frac)", r"\1 \2", text)  # mixed number 1\frac{1}{2}
    text = _LATEX_FRAC.sub(r"(\1)/(\2)", text)
    for old, new in (
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\$", ""),
        ("\\%", "%"),
        ("−", "-"),
        ("\\text", ""),
    ):
        text = text.replace(old, new)
    text = re.sub(r"\((-?[\d.,]+)\)", r"\1", text)  # (3)/(4) -> 3/4
    return text.replace("$", "").replace("{", " ").replace("}", " ")


def parse_number(answer: str) -> Fraction | None:
    """The exact value of an answer like "1/2", "0.5", "\\frac{1}{2}", "x = 1 1/2", "$1,000", "25%"; None if none."""
    text = _normalize(answer).strip()
    if _HEDGE.search(text):
        return None
    text = text.rsplit("=", 1)[-1].strip()  # "x = 5" -> "5"
    if _SCIENTIFIC.fullmatch(text):
        return Fraction(text)
    match = _TOKEN.search(text)
    if match is None:
        return None
    token = match.group(0).replace(",", "")
    sign = -1 if text[: match.start()].rstrip().endswith("-") and not token.startswith("-") else 1
    try:
        mixed = re.fullmatch(r"(-?)(\d+)\s+(\d+)\s*/\s*(\d+)", token)
        if mixed:
            value = int(mixed.group(2)) + Fraction(int(mixed.group(3)), int(mixed.group(4)))
            return sign * (-value if mixed.group(1) else value)
        numerator, _, denominator = token.partition("/")
        value = (
            Fraction(numerator.strip()) / Fraction(denominator.strip()) if denominator else Fraction(numerator.strip())
        )
        return sign * value
    except (ValueError, ZeroDivisionError):
        return None


class MathEnv(AgentEnv):
    """Solve a generated word problem; the reply's final answer is checked exactly.

    Reward: 1.0 for a correct final answer (the episode ends), 0.0 otherwise. With `attempts` > 1 a
    wrong answer gets "incorrect, try again" until the attempts run out. Replies with no number to
    read are explained and do not use up an attempt. `info` carries `success`, `attempts_left`,
    `invalid_action`, `kind`, `difficulty`, `parsed_answer` and `anchor`.
    """

    tools = (submit,)
    system_prompt = (
        "Solve the math problem. Think step by step, then give your final answer as \\boxed{ANSWER} "
        '(or on a last line "Answer: ANSWER", or with the tool call <tool_call>{"name": "submit", '
        '"arguments": {"answer": "ANSWER"}}</tool_call>). Write the answer as a number: an integer, a decimal, '
        "or a fraction like 7/3; no units needed."
    )
    reward_doc = (
        "1.0 for an exactly correct final answer (\\boxed{}, Answer:, <answer>, submit, or last number), else 0.0."
    )

    def __init__(
        self, kind: str = "any", difficulty: int = 2, attempts: int = 1, render_mode: str | None = None
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown math kind {kind!r}; choose one of {', '.join(KINDS)}")
        if difficulty not in (1, 2, 3):
            raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty!r}")
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self.kind, self.difficulty, self.attempts = kind, difficulty, attempts
        self.render_mode = render_mode
        self.problem: Problem | None = None
        self.attempts_left = attempts
        self.done = False
        self._last_answer: Fraction | None = None

    @property
    def answer(self) -> Fraction:
        """The exact answer of the current problem (the oracle)."""
        if self.problem is None:
            raise ResetNeeded("there is no problem yet", hint="call reset() first")
        return self.problem.answer

    def oracle_action(self) -> str | None:
        """A reply with the correct answer, after the problem's worked steps when it has them, e.g.
        "4 x 9 = 36, 5 x 7 = 35, 36 + 35 = 71. \\boxed{71}" or "\\boxed{7/3}"; None when the episode is over.

        Expert episodes (`envhub collect`, the trainer's `sft:` stage) teach what the oracle writes: the working
        shows a small model how to reach the number, not only where to put it."""
        if self.problem is None or self.done:
            return None
        boxed = f"\\boxed{{{format_number(self.answer)}}}"
        return f"{self.problem.working} {boxed}" if self.problem.working else boxed

    # -- episode -------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        rng = random.Random(int(self.np_random.integers(2**63)))
        self.problem = generate(self.kind, self.difficulty, rng)
        self.attempts_left, self.done, self._last_answer = self.attempts, False, None
        return self.render_text(), self.base_info(**self._info(invalid=False))

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.problem is None or self.done:
            raise ResetNeeded("step() called before reset() or after the episode ended", hint="call reset() first")
        value, problem = self._read_answer(action)
        if value is None:
            return (
                f"{problem}\n\nThe problem again: {self.problem.question}",
                0.0,
                False,
                False,
                self._info(invalid=True),
            )
        self._last_answer = value
        if value == self.problem.answer:
            self.done = True
            return f"Correct! The answer is {format_number(value)}.", 1.0, True, False, self._info(invalid=False)
        self.attempts_left -= 1
        if self.attempts_left > 0:
            plural = "s" if self.attempts_left > 1 else ""
            obs = (
                f"Your answer {format_number(value)} is incorrect, try again ({self.attempts_left} attempt{plural} "
                f"left)."
            )
            return obs, 0.0, False, False, self._info(invalid=False)
        self.done = True
        obs = (
            f"Your answer {format_number(value)} is incorrect. The correct answer was "
            f"{format_number(self.problem.answer)}."
        )
        return obs, 0.0, True, False, self._info(invalid=False)

    def _read_answer(self, action: Any) -> tuple[Fraction | None, str]:
        """The exact value of the reply's final answer, or None and a message saying what was wrong."""
        parsed = parse_tool_calls(action, self.tools)
        if parsed.errors:
            return None, parsed.error_message()
        if parsed.calls:
            text = str(parsed.calls[-1].arguments.get("answer", ""))
        elif len(parsed.text) > MAX_ACTION_CHARS:
            return (
                None,
                f"Your reply is {len(parsed.text)} characters long; the limit is {MAX_ACTION_CHARS}. Keep your "
                f"working short and end with \\boxed{{ANSWER}}.",
            )
        else:
            text = parsed.text
        final = extract_answer(text)
        if final is None:
            shown = text.strip()[:60] or "(empty)"
            return (
                None,
                f"No answer found in your reply {shown!r}. End your reply with your final answer as "
                f"\\boxed{{ANSWER}}, e.g. \\boxed{{42}} or \\boxed{{7/3}}.",
            )
        value = parse_number(final)
        if value is None:
            return None, (
                f"Could not read one number from your final answer {final.strip()[:60]!r}. Give a single answer "
                "written as an integer, a decimal or a fraction, e.g. \\boxed{7/3}."
            )
        return value, ""

    def anchor(self) -> str | None:
        """A digest of the problem text (and `solved` once answered right)."""
        if self.problem is None:
            return None
        solved = self._last_answer is not None and self._last_answer == self.problem.answer
        return f"problem={state_digest(self.problem.question)}" + ("|solved" if solved else "")

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        assert self.problem is not None
        return {
            "success": self._last_answer is not None and self._last_answer == self.problem.answer,
            "attempts_left": self.attempts_left,
            "invalid_action": invalid,
            "kind": self.problem.kind,
            "difficulty": self.difficulty,
            "parsed_answer": None if self._last_answer is None else format_number(self._last_answer),
            "anchor": self.anchor(),
        }

    def render_text(self) -> str:
        """The problem text, with the attempts left."""
        if self.problem is None:
            return "(no problem yet: call reset())"
        plural = "s" if self.attempts_left != 1 else ""
        return (
            f"{self.problem.question}\n\n(You have {self.attempts_left} attempt{plural}. End with your final "
            f"answer as \\boxed{{ANSWER}}.)"
        )
