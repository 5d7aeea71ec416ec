"""`TurnGame`: the PettingZoo `AECEnv` plumbing shared by envhub's turn-based text games.

A game subclass supplies its rules (`_new_state`, `legal_actions`, `_apply`, `_outcome`), how a
move is written (`move_name`, `parse_move`), what a seat sees (`observe_text`, `observe_array`)
and its players (`solver_action`, `scripted_action`). The base class keeps PettingZoo's
bookkeeping: agent order, rewards, terminations, infos and the action mask.

Observations are dicts: `"text"` is what a language model reads (board, whose turn, legal moves);
`"observation"` (a numeric encoding) and `"action_mask"` are there because PettingZoo's
`api_test` requires numeric arrays under those keys. `infos[agent]` repeats the mask, lists the
legal moves by name and holds `anchor`: the position as that seat may know it and whose turn it is
(`"board=X.O......|to_move=0"`), never the order the moves came in. Stepping an illegal action id raises
ValueError naming the legal moves (`envhub.SelfPlay` turns illegal text moves into observations instead).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

from envhub.core import TextRender, UnicodeText

OBSERVATION_TEXT_LENGTH = 4096


def seed_game(env: Any, seed: int | None) -> None:
    """Reseed a game's own RNG and each seat's action space (seat i gets seed + i); None keeps the current RNG."""
    if seed is not None:
        env.rng = np.random.default_rng(seed)
        for i, agent in enumerate(env.possible_agents):
            env.action_spaces[agent].seed(seed + i)


class TurnGame(TextRender, AECEnv):
    """Two seats taking turns; one action per turn from a `Discrete` space."""

    reward_doc: ClassVar[str] = (
        "+1 to the winner and -1 to the loser when the game ends, 0 each for a draw; 0 on every other turn."
    )

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi", "human"],
        "name": "turn_game",
        "is_parallelizable": False,
    }
    num_actions: ClassVar[int] = 0
    observation_shape: ClassVar[tuple[int, ...]] = ()
    #: How a move is written, shown to players ("a cell such as B2", "a column 1-7", ...).
    move_help: ClassVar[str] = ""

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__()
        self.render_mode = render_mode
        self.possible_agents = ["player_0", "player_1"]
        obs_space = spaces.Dict(
            {
                "observation": spaces.Box(-1, 3, shape=self.observation_shape, dtype=np.int8),
                "action_mask": spaces.Box(0, 1, shape=(self.num_actions,), dtype=np.int8),
                "text": UnicodeText(OBSERVATION_TEXT_LENGTH),
            }
        )
        self.observation_spaces = {a: obs_space for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(self.num_actions) for a in self.possible_agents}
        self.rng = np.random.default_rng()
        self.history: list[tuple[int, int]] = []  # (seat, action)

    # -- rules: subclasses implement these ----------------------------------------------------
    def _new_state(self) -> None:
        raise NotImplementedError

    def current_seat(self) -> int:
        """The seat (0 or 1) to move."""
        raise NotImplementedError

    def legal_actions(self) -> list[int]:
        """Legal action ids for the seat to move (empty once the game is over)."""
        raise NotImplementedError

    def _apply(self, action: int) -> None:
        raise NotImplementedError

    def _outcome(self) -> tuple[float, float] | None:
        """Final rewards of both seats, or None while the game goes on."""
        raise NotImplementedError

    def move_name(self, action: int) -> str:
        """How action `action` is written in text (e.g. "B2")."""
        raise NotImplementedError

    def parse_move(self, text: str) -> int | None:
        """The action id written in `text`, or None if it names no move."""
        raise NotImplementedError

    def board_text(self, seat: int) -> str:
        """The position as seat `seat` may see it."""
        raise NotImplementedError

    def position(self, seat: int) -> str:
        """The position as seat `seat` may know it, written exactly and briefly (e.g. "board=X.O......")."""
        raise NotImplementedError

    def observe_array(self, seat: int) -> np.ndarray:
        """Numeric encoding of what seat `seat` sees."""
        raise NotImplementedError

    def solver_action(self, rng: np.random.Generator) -> int:
        """The perfect (or strongest available) player's action for the seat to move."""
        raise NotImplementedError

    def scripted_action(self, rng: np.random.Generator) -> int:
        """A simple rule-based player's action for the seat to move."""
        raise NotImplementedError

    # -- PettingZoo API -----------------------------------------------------------------------
    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        seed_game(self, seed)
        self.agents = list(self.possible_agents)
        self.history = []
        self._new_state()
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.agent_selection = self.possible_agents[self.current_seat()]
        self._refresh_infos()

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        action = int(action)  # type: ignore[arg-type]
        if action not in self.legal_actions():
            legal = ", ".join(self.move_name(a) for a in self.legal_actions())
            raise ValueError(f"illegal action {action} for {agent}; legal: {legal}")
        self._cumulative_rewards[agent] = 0.0
        seat = self.current_seat()
        self._apply(action)  # rules see the position before the move is recorded
        self.history.append((seat, action))
        self.rewards = {a: 0.0 for a in self.agents}
        outcome = self._outcome()
        if outcome is not None:
            for seat, agent_name in enumerate(self.possible_agents):
                self.rewards[agent_name] = float(outcome[seat])
                self.terminations[agent_name] = True
            self.agent_selection = agent  # PettingZoo lets each finished agent see `last()` in turn
        else:
            self.agent_selection = self.possible_agents[self.current_seat()]
        self._refresh_infos()
        self._accumulate_rewards()
        if self.render_mode == "human":
            print(self.render_text())

    def observe(self, agent: str) -> dict[str, Any]:
        seat = self.possible_agents.index(agent)
        return {
            "observation": self.observe_array(seat),
            "action_mask": self.action_mask(agent),
            "text": self.observe_text(seat),
        }

    def close(self) -> None:
        pass

    # -- text helpers -------------------------------------------------------------------------
    def outcome(self) -> tuple[float, float] | None:
        """Final rewards of (player_0, player_1), or None while the game goes on."""
        return self._outcome()

    def game_over(self) -> bool:
        """True once the game has a result."""
        return self._outcome() is not None

    def action_mask(self, agent: str) -> np.ndarray:
        """1 for each legal action of `agent` (all zeros when it is not their turn)."""
        mask = np.zeros(self.num_actions, dtype=np.int8)
        if not self.game_over() and self.possible_agents[self.current_seat()] == agent:
            mask[self.legal_actions()] = 1
        return mask

    def legal_moves(self) -> list[str]:
        """The legal moves of the seat to move, by name."""
        return [self.move_name(a) for a in self.legal_actions()]

    def observe_text(self, seat: int) -> str:
        """Everything seat `seat` may know, as text: position, whose turn, legal moves."""
        lines = [self.board_text(seat), f"You are {self.seat_name(seat)}."]
        outcome = self._outcome()
        if outcome is not None:
            result = outcome[seat]
            lines.append(
                "Game over: " + ("you won" if result > 0 else "you lost" if result < 0 else "draw") + f" ({result:+g})."
            )
        elif self.current_seat() == seat:
            lines.append(f"Your turn. Legal moves: {', '.join(self.legal_moves())}. Write {self.move_help}.")
        else:
            lines.append(f"Waiting for {self.seat_name(1 - seat)} to move.")
        return "\n".join(lines)

    def seat_name(self, seat: int) -> str:
        """How a seat is called in text."""
        return f"player {seat}"

    def anchor(self, seat: int) -> str:
        """`infos[agent]["anchor"]`: the position seat `seat` may know and whose turn it is ("over" once decided)."""
        return f"{self.position(seat)}|to_move={'over' if self.game_over() else self.current_seat()}"

    def render_text(self) -> str:
        """The full position (both seats' views for hidden-information games)."""
        return self.board_text(-1)

    def _refresh_infos(self) -> None:
        moves = [] if self.game_over() else self.legal_moves()
        self.infos = {
            a: {
                "action_mask": self.action_mask(a),
                "legal_moves": moves if a == self.possible_agents[self.current_seat()] else [],
                "anchor": self.anchor(self.possible_agents.index(a)),
            }
            for a in self.agents
        }
