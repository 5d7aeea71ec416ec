"""Letters-v0: a dense-reward warm-up env for trainer smoke tests and CI.

The agent is asked to reply using only the given letters; the reward is the share of the reply's
non-space characters that are among them (0.0 for an empty reply). A random tiny model scores about a
third with vowels, so GRPO groups have reward variance from the first step and learning shows quickly.

Every turn acts in the same state (the letters; only the turn count moves), so `info["anchor"]` is
`letters=aeiou` on reset and on every step.
"""

from __future__ import annotations

from typing import Any

from envhub.core import AgentEnv
from envhub.toolcalls import action_text


class LettersEnv(AgentEnv):
    """Reply using only the target letters; one turn by default."""

    system_prompt = "Reply with a short text written only with the letters you are given."
    reward_doc = "share of the reply's non-space characters that are target letters, in [0, 1]"

    def __init__(self, letters: str = "aeiou", turns: int = 1, render_mode: str | None = None) -> None:
        if not letters:
            raise ValueError("letters must not be empty")
        self.letters = set(letters.lower())
        self.turns = turns
        self.played = 0
        self.render_mode = render_mode

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        _, info = super().reset(seed=seed)
        self.played = 0
        info["anchor"] = self.anchor()
        return f"Write something using only these letters: {' '.join(sorted(self.letters))}", info

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        text = action_text(action)
        chars = [c for c in text.lower() if not c.isspace()]
        reward = sum(c in self.letters for c in chars) / len(chars) if chars else 0.0
        self.played += 1
        done = self.played >= self.turns
        return f"Score {reward:.2f}. Again.", reward, done, False, {"share": reward, "anchor": self.anchor()}

    def anchor(self) -> str | None:
        """The target letters: all a turn's reward depends on."""
        return "letters=" + "".join(sorted(self.letters))

    def render_text(self) -> str:
        return f"letters: {' '.join(sorted(self.letters))}; turn {self.played} of {self.turns}"
