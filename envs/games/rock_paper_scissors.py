"""Rock-paper-scissors over several rounds as a PettingZoo `ParallelEnv` (simultaneous moves).

Both players choose at once each round ("rock", "paper", "scissors", or r/p/s); the text
observation shows the score and every earlier round. Reward per round: +1 to the winner, -1 to
the loser, 0 on a tie. The equilibrium player picks uniformly at random.

`infos[agent]["anchor"]` is the rounds played and the score, `rounds=2|score=1:0`: here the round count is the
state itself (the game ends after `rounds` of them, and nothing else carries over), while the order the rounds
were won in is history and stays out.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from envhub.core import UnicodeText
from envhub.envs.games.base import seed_game

MOVES = ("rock", "paper", "scissors")
_MOVE = re.compile(r"^\s*(rock|paper|scissors|r|p|s)\b", re.IGNORECASE)


def beats(a: int, b: int) -> bool:
    """True when move `a` beats move `b` (paper > rock > scissors > paper)."""
    return (a - b) % 3 == 1


class RockPaperScissorsEnv(ParallelEnv):
    """`rounds` rounds of rock-paper-scissors between player_0 and player_1."""

    reward_doc: ClassVar[str] = "every round: +1 to its winner, -1 to its loser, 0 each on a tie."
    move_names: ClassVar[tuple[str, ...]] = MOVES

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi"],
        "name": "rock_paper_scissors_v0",
        "is_parallelizable": True,
    }

    def __init__(self, rounds: int = 5, render_mode: str | None = None) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds}")
        self.rounds = rounds
        self.render_mode = render_mode
        self.possible_agents = ["player_0", "player_1"]
        self.observation_spaces = {a: UnicodeText(4096) for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(3) for a in self.possible_agents}
        self.history: list[tuple[int, int]] = []
        self.rng = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    def parse_move(self, text: str) -> int | None:
        """The move named at the start of `text`, or None."""
        match = _MOVE.match(text)
        return None if match is None else "rps".index(match.group(1)[0].lower())

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, dict]]:
        seed_game(self, seed)
        self.agents = list(self.possible_agents)
        self.history = []
        return self._observations(), self._infos()

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"every live agent must act each round; missing {missing}")
        moves = (int(actions["player_0"]), int(actions["player_1"]))
        self.history.append(moves)
        score = 1.0 if beats(*moves) else -1.0 if beats(moves[1], moves[0]) else 0.0
        rewards = {"player_0": score, "player_1": -score}
        done = len(self.history) >= self.rounds
        observations, infos = self._observations(), self._infos()
        terminations = {a: done for a in self.agents}
        truncations = {a: False for a in self.agents}
        if done:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def equilibrium_action(self, rng: np.random.Generator) -> int:
        """The Nash equilibrium: each move with probability 1/3."""
        return int(rng.integers(3))

    def observe_text(self, seat: int) -> str:
        """Score, earlier rounds and what to write, from seat `seat`'s side."""
        mine = sum(beats(r[seat], r[1 - seat]) for r in self.history)
        theirs = sum(beats(r[1 - seat], r[seat]) for r in self.history)
        lines = [
            f"Rock-paper-scissors, {self.rounds} rounds. You are player_{seat}. Score: you {mine}, opponent {theirs}."
        ]
        for i, r in enumerate(self.history, 1):
            lines.append(f"Round {i}: you {MOVES[r[seat]]}, opponent {MOVES[r[1 - seat]]}.")
        if len(self.history) < self.rounds:
            lines.append(f"Round {len(self.history) + 1}: choose rock, paper or scissors.")
        else:
            lines.append("Game over.")
        return "\n".join(lines)

    def anchor(self) -> str:
        """The rounds played and the wins of player_0 and player_1 (the same for both seats: no move is hidden)."""
        wins = [sum(beats(r[seat], r[1 - seat]) for r in self.history) for seat in (0, 1)]
        return f"rounds={len(self.history)}|score={wins[0]}:{wins[1]}"

    def _observations(self) -> dict[str, str]:
        return {a: self.observe_text(i) for i, a in enumerate(self.possible_agents)}

    def _infos(self) -> dict[str, dict[str, Any]]:
        open_round = len(self.history) < self.rounds
        mask = np.full(3, int(open_round), dtype=np.int8)
        anchor = self.anchor()
        return {
            a: {"action_mask": mask.copy(), "legal_moves": list(MOVES) if open_round else [], "anchor": anchor}
            for a in self.possible_agents
        }

    def render(self) -> str | None:
        return self.observe_text(0)

    def close(self) -> None:
        pass
