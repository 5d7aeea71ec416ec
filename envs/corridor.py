"""Corridor-v0: a multi-turn env where credit assignment matters, the positive control of step-level advantages.

The agent stands on square 0 of a corridor and must reach the last square within a few turns. Each reply either
moves it one square forward or wastes the turn, by its first letter: a reply starting with a to m moves (with
`alternate=True`: on even squares; on odd squares one starting with n to z does); any other reply, and one with no
letter, wastes the turn. The reward, 1.0, comes only on arrival, so episode-level credit pays every
turn of a successful episode the same, wasted ones included, and blames the good moves of a failed one; a
step-level estimator (GiGPO) compares turns that acted from the same square: `info["anchor"]` is the square, exactly.

The rule is arbitrary on purpose: a random tiny model moves about half the time, so groups differ from the first
step, and learning it is a matter of credit rather than knowledge. The positive control (configs/corridor-tiny.yaml,
docs/trainer.md "Credit assignment") trains with turns to spare (`max_turns` 8 for 4 squares), where most episodes
arrive and the episode's reward cannot tell a wasted turn from a move, and evaluates with none to spare.
Alternating makes the right reply depend on the square, so a policy that collapses onto one reply cannot pass; the
tiny model did not learn it in 12 steps with either estimator (docs/trainer.md, the positive control).
"""

from __future__ import annotations

from typing import Any

from envhub.core import AgentEnv
from envhub.toolcalls import action_text

FIRST_HALF = frozenset("abcdefghijklm")


def first_letter(text: str) -> str:
    """The reply's first letter, lower-cased ("" when it has none)."""
    return next((c.lower() for c in text if c.isascii() and c.isalpha()), "")


class CorridorEnv(AgentEnv):
    """Reach square `length` from square 0 within `max_turns` replies; 1.0 on arrival, else 0.0.

    `info`: `position`, `moved` (this reply moved), `success`, and `anchor` (the square: the state a turn acts in).
    """

    system_prompt = (
        "You walk down a corridor, one reply per turn. A reply that starts with a letter from a to m moves you one "
        "square forward; any other reply wastes the turn. Reach the end before your turns run out."
    )
    alternating_prompt = (
        "You walk down a corridor, one reply per turn. On an even square a reply that starts with a letter from a to "
        "m moves you one square forward, on an odd square one that starts with a letter from n to z; any other reply "
        "wastes the turn. Reach the end before your turns run out."
    )
    reward_doc = "1.0 on reaching the last square (episode ends), 0.0 otherwise (truncated after max_turns replies)"

    def __init__(
        self,
        length: int = 3,
        max_turns: int = 5,
        alternate: bool = False,
        demo_waste: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        if not 0.0 <= demo_waste < 1.0:
            raise ValueError(f"demo_waste is the share of turns the demonstrator wastes, in [0, 1); got {demo_waste}")
        if length < 1:
            raise ValueError(f"Corridor length must be at least 1, got {length}")
        if max_turns < length:
            raise ValueError(f"max_turns ({max_turns}) must be at least the corridor's length ({length})")
        self.length = length
        self.max_turns = max_turns
        self.alternate = alternate
        self.demo_waste = demo_waste
        if alternate:
            self.system_prompt = self.alternating_prompt
        self.render_mode = render_mode
        self.position = 0
        self.played = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        _, info = super().reset(seed=seed)
        self.position = self.played = 0
        return self._observation(), {**info, **self._info(moved=False)}

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        letter = first_letter(action_text(action))
        first_half = self.position % 2 == 0 or not self.alternate
        moved = bool(letter) and (letter in FIRST_HALF) == first_half
        self.position += moved
        self.played += 1
        arrived = self.position >= self.length
        truncated = not arrived and self.played >= self.max_turns
        return self._observation(), 1.0 if arrived else 0.0, arrived, truncated, self._info(moved=moved)

    def _observation(self) -> str:
        if self.position >= self.length:
            return "You reached the end of the corridor."
        half = "a to m" if self.position % 2 == 0 or not self.alternate else "n to z"
        return f"You are on square {self.position} ({half} moves you); the corridor ends at square {self.length}."

    def _info(self, moved: bool) -> dict[str, Any]:
        return {
            "position": self.position,
            "moved": moved,
            "success": self.position >= self.length,
            "anchor": self.anchor(),
        }

    def oracle_action(self) -> str:
        """The demonstrator's reply (the expert agent's, for SFT data): a move, or with probability `demo_waste` a
        wasted turn, drawn from the env's seeded RNG (a warm start that wastes turns leaves RL something to learn)."""
        first_half = self.position % 2 == 0 or not self.alternate
        if self.np_random.random() < self.demo_waste:
            return "wait" if first_half else "hold"
        return "go" if first_half else "run"

    def anchor(self) -> str:
        """The square: all a turn's future depends on (turns left are a counter, left out as anchors require)."""
        return f"square={self.position}"

    def render_text(self) -> str:
        return "".join("A" if i == self.position else "." for i in range(self.length + 1))
