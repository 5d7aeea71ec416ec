"""`SimultaneousTurns`: a two-player simultaneous-move PettingZoo `ParallelEnv` played as sealed turns.

Each round the seat `first_seat` commits its move, then the other seat commits without seeing it
(observations only show finished rounds), then the round is resolved by the parallel env. This gives
the turn-game interface `SelfPlay` plays (current_seat, legal_actions, step, outcome, ...), so a
simultaneous game is evaluated seat by seat like the turn games. Put the agent's seat first so
that neither side ever sees a move it should not: `SelfPlay` names the opponent's moves made before
the agent's turn, which are only ever from finished rounds then.

The wrapped env must offer `parse_move(text)`, `observe_text(seat)` and `equilibrium_action(rng)`,
with `Discrete` action spaces and optionally `move_names` (rock-paper-scissors has all). The outcome is
each seat's reward summed over the rounds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envhub.errors import ConfigError


class SimultaneousTurns:
    """The parallel env `game` as alternating sealed moves, `first_seat` committing first each round."""

    def __init__(self, game: Any, first_seat: int = 0, move_names: tuple[str, ...] | None = None) -> None:
        for needed in ("parse_move", "observe_text", "equilibrium_action", "possible_agents"):
            if not hasattr(game, needed):
                raise ConfigError(
                    f"SimultaneousTurns needs a two-player parallel game with {needed}, got {type(game).__name__}"
                )
        if len(game.possible_agents) != 2 or first_seat not in (0, 1):
            raise ConfigError(
                f"SimultaneousTurns plays two seats (first_seat 0 or 1), got {game.possible_agents} and {first_seat!r}"
            )
        self.parallel = game
        self.first_seat = first_seat
        self.num_actions = int(game.action_space(game.possible_agents[0]).n)
        self.move_names = (
            move_names or tuple(getattr(game, "move_names", ())) or tuple(str(a) for a in range(self.num_actions))
        )
        self.name = type(game).__name__.removesuffix("Env")  # SelfPlay names the game in its system prompt
        self.move_help = " or ".join(self.move_names)
        self._sealed: dict[int, int] = {}
        self._totals = [0.0, 0.0]
        self._over = True

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.parallel.reset(seed=seed, options=options)
        self._sealed, self._totals, self._over = {}, [0.0, 0.0], False

    # -- the turn-game interface SelfPlay uses ------------------------------------------------
    def current_seat(self) -> int:
        return self.first_seat if not self._sealed else 1 - self.first_seat

    def legal_actions(self) -> list[int]:
        return [] if self._over else list(range(self.num_actions))

    def step(self, action: int) -> None:
        """Seal the current seat's move; the second sealed move resolves the round."""
        if self._over:
            raise ConfigError("the game is over", hint="call reset() to start a new game")
        self._sealed[self.current_seat()] = int(action)
        if len(self._sealed) < 2:
            return
        agents = self.parallel.possible_agents
        _, rewards, terminations, truncations, _ = self.parallel.step({agents[s]: a for s, a in self._sealed.items()})
        self._sealed = {}
        for seat, agent in enumerate(agents):
            self._totals[seat] += float(rewards[agent])
        self._over = all(terminations.values()) or all(truncations.values())

    def game_over(self) -> bool:
        return self._over

    def outcome(self) -> tuple[float, float] | None:
        return (self._totals[0], self._totals[1]) if self._over else None

    def move_name(self, action: int) -> str:
        return self.move_names[action]

    def parse_move(self, text: str) -> int | None:
        return self.parallel.parse_move(text)

    def observe_text(self, seat: int) -> str:
        return self.parallel.observe_text(seat)  # finished rounds only: a sealed move is never shown

    def solver_action(self, rng: np.random.Generator) -> int:
        return int(self.parallel.equilibrium_action(rng))

    def scripted_action(self, rng: np.random.Generator) -> int:
        """The move after the opponent's previous one in the game's cycle (beats it in rock-paper-scissors); equilibrium
        first."""
        history = getattr(self.parallel, "history", [])
        if not history:
            return self.solver_action(rng)
        seat = self.current_seat()
        return (int(history[-1][1 - seat]) + 1) % self.num_actions

    def anchor(self, seat: int) -> str | None:
        """The parallel game's anchor and which seats have sealed a move (not the move: the other seat cannot see it);
        None when the game gives none."""
        parallel = getattr(self.parallel, "anchor", None)
        if parallel is None:
            return None
        return f"{parallel()}|sealed={''.join(str(s) for s in sorted(self._sealed))}"

    def render_text(self) -> str:
        return self.parallel.observe_text(0)
