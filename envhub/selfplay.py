"""`SelfPlay`: one seat of a turn-based multi-agent game as a single-agent `AgentEnv`.

The agent writes its move as text ("B2", "4", "call") or as a `move` tool call; the other seat is
played by an opponent: "random", "scripted" (simple rules), "perfect" (the game's solver), or a
callable `(observation_text, legal_moves) -> move` that may be async (e.g. a policy served by an
inference engine).

Rewards: the game's result for the agent's seat when it ends (+1 win, 0 draw, -1 loss; Kuhn poker:
chips won, +-1 or +-2). An illegal or unreadable move changes nothing on the board, costs
`illegal_penalty` (0.1) and returns an observation listing the legal moves; after `max_illegal`
(3) in a row the agent forfeits: the episode ends with reward -1.

`info["anchor"]` is the agent's seat and the game's anchor for it (the position it may know, whose turn), when
the game gives one (envhub's turn games do; TextArena's do not). It leaves out the streak of illegal moves, a
count of wasted turns like a step limit, so an illegal move keeps the anchor as it was.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import numpy as np

from envhub.core import AgentEnv
from envhub.errors import ConfigError, ResetNeeded
from envhub.toolcalls import parse_tool_calls
from envhub.tools import tool

OpponentPolicy = Callable[[str, list[str]], str | int | Awaitable[str | int]]
OPPONENTS = ("random", "scripted", "perfect")
FORFEIT_REWARD = -1.0


@tool
def move(move: str) -> str:
    """Make your move in the game.

    Args:
        move: The move as the observation writes it, e.g. "B2" (TicTacToe), "4" (ConnectFour), "call" (poker).
    """
    return move


class SelfPlay(AgentEnv):
    """A two-seat game seen from one seat, with the other seat played by `opponent`."""

    tools = (move,)
    reward_doc: ClassVar[str] = (
        "game result at the end (+1 win, 0 draw, -1 loss; poker: chips won); an illegal move costs "
        "illegal_penalty and after max_illegal in a row the episode ends with -1"
    )

    def __init__(
        self,
        game: Any = "TicTacToe-v0",
        opponent: str | OpponentPolicy = "random",
        seat: int | str = 0,
        *,
        illegal_penalty: float = 0.1,
        max_illegal: int = 3,
        game_kwargs: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if isinstance(game, str):
            from envhub.registry import make_multiagent

            game = make_multiagent(game, **(game_kwargs or {}))
        # free-text games (TextArena through envhub.envs.adapters) take the agent's text as the move
        self.free_text = bool(getattr(game, "free_text_moves", False))
        needs = (
            ("observe_text", "current_seat", "random_move")
            if self.free_text
            else ("parse_move", "legal_actions", "move_name", "observe_text", "solver_action", "current_seat")
        )
        for needed in needs:
            if not hasattr(game, needed):
                raise ConfigError(
                    f"SelfPlay needs an envhub turn game, got {type(game).__name__} (no {needed}())",
                    hint="pass an id such as 'TicTacToe-v0' or an envhub.envs.games TurnGame instance",
                )
        if not (callable(opponent) or opponent in OPPONENTS):
            raise ConfigError(
                f"unknown opponent {opponent!r}",
                hint=f"use one of {', '.join(OPPONENTS)} or a callable (text, legal_moves) -> move",
            )
        if seat not in (0, 1, "random"):
            raise ConfigError(f"seat must be 0, 1 or 'random', got {seat!r}")
        if max_illegal < 1:
            raise ConfigError(f"max_illegal must be at least 1, got {max_illegal}")
        self.game = game
        self.opponent = opponent
        self.seat_choice = seat
        self.illegal_penalty = illegal_penalty
        self.max_illegal = max_illegal
        self.render_mode = render_mode
        self.seat = 0 if seat == "random" else int(seat)
        self._illegal_streak = 0
        self._opponent_illegal = 0
        self._done = True
        name = getattr(game, "name", None) or type(game).__name__.removesuffix("Env")
        self.system_prompt = (
            f"You are playing {name} against an opponent, one move per turn. Each observation shows the "
            f"position and your legal moves. Reply with just your move ({game.move_help}), or call the "
            f"`move` tool. Illegal moves cost {illegal_penalty} and {max_illegal} in a row lose the game."
        )

    # -- episode ------------------------------------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        _, info = await super().areset(seed=seed, options=options)
        if self.seat_choice == "random":
            self.seat = int(self.np_random.integers(2))
        self.game.reset(seed=int(self.np_random.integers(2**31)))
        self._illegal_streak = 0
        self._opponent_illegal = 0
        self._done = False
        opponent_moves = await self._play_opponent()
        info.update(self._info(opponent_moves))
        return self._observation(opponent_moves), info

    async def astep(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise ResetNeeded("the game is over", hint="call reset() to start a new game")
        chosen, problem = self._read_move(action)
        if chosen is None:
            self._illegal_streak += 1
            info = self._info([]) | {"illegal_move": True}
            if self._illegal_streak >= self.max_illegal:
                self._done = True
                text = f"{problem}\nThat was {self.max_illegal} illegal moves in a row: you forfeit the game."
                return text, FORFEIT_REWARD, True, False, info | {"forfeit": True}
            left = self.max_illegal - self._illegal_streak
            text = (
                f"{problem}\nNothing changed (penalty -{self.illegal_penalty:g}; {left} more illegal move(s) in a row "
                f"forfeit the game).\n\n{self.game.observe_text(self.seat)}"
            )
            return text, -self.illegal_penalty, False, False, info
        self._illegal_streak = 0
        self.game.step(chosen)
        opponent_moves = await self._play_opponent()
        outcome = self.game.outcome()
        reward = 0.0 if outcome is None else float(outcome[self.seat])
        self._done = outcome is not None
        return self._observation(opponent_moves), reward, self._done, False, self._info(opponent_moves)

    def _read_move(self, action: str | dict[str, Any]) -> tuple[int | None, str]:
        """The legal action the agent wrote, or None and a message saying what was wrong."""
        parsed = parse_tool_calls(action, tools=self.tools)
        if self.free_text:  # the game judges the move itself (and ends it after its own error allowance)
            text = str(parsed.calls[0].arguments.get("move", "")) if parsed.calls else parsed.text
            return (text, "") if text.strip() else (None, "Empty move: " + self.game.move_help + ".")
        legal = self.game.legal_actions()
        legal_text = "Legal moves: " + ", ".join(self.game.move_name(a) for a in legal) + "."
        if parsed.calls:
            text = str(parsed.calls[0].arguments.get("move", ""))
        elif parsed.errors:
            return None, parsed.error_message() + "\n" + legal_text
        else:
            text = parsed.text
        # a model often reasons first and names its move last: try the last word, the last line, then everything
        candidates = [*text.split()[-1:], *text.strip().splitlines()[-1:], text]
        chosen = next((a for a in map(self.game.parse_move, candidates) if a is not None), None)
        shown = text.strip()[:80] or "(empty)"
        if chosen is None:
            return None, f"Could not read a move in {shown!r}. Write {self.game.move_help}. {legal_text}"
        if chosen not in legal:
            return None, f"Illegal move {shown!r}: {self.game.move_name(chosen)} is not allowed now. {legal_text}"
        return chosen, ""

    async def _play_opponent(self) -> list[str]:
        """Let the opponent move until it is the agent's turn or the game is over."""
        names = []
        while not self.game.game_over() and self.game.current_seat() != self.seat:
            action = await self._opponent_action()
            names.append(action if self.free_text else self.game.move_name(action))
            self.game.step(action)
        return names

    async def _opponent_action(self) -> Any:
        rng: np.random.Generator = self.np_random
        if self.free_text:
            if not callable(self.opponent):
                return self.game.random_move(rng)
            reply = self.opponent(self.game.observe_text(self.game.current_seat()), [])
            return str(await reply if inspect.isawaitable(reply) else reply)
        legal = self.game.legal_actions()
        if self.opponent == "random":
            return int(rng.choice(legal))
        if self.opponent == "perfect":
            return int(self.game.solver_action(rng))
        if self.opponent == "scripted":
            return int(self.game.scripted_action(rng))
        seat = 1 - self.seat
        reply = self.opponent(self.game.observe_text(seat), [self.game.move_name(a) for a in legal])  # type: ignore[operator]
        if inspect.isawaitable(reply):
            reply = await reply
        chosen = int(reply) if isinstance(reply, (int, np.integer)) else self.game.parse_move(str(reply))
        if chosen not in legal:
            self._opponent_illegal += 1
            return int(rng.choice(legal))  # a broken opponent must not break the agent's episode
        return chosen

    # -- text ---------------------------------------------------------------------------------
    def _observation(self, opponent_moves: list[str]) -> str:
        prefix = f"Your opponent played {', '.join(opponent_moves)}.\n" if opponent_moves else ""
        return prefix + self.game.observe_text(self.seat)

    def anchor(self) -> str | None:
        """The agent's seat and the game's anchor for it; None when the game gives none."""
        game_anchor = self.game.anchor(self.seat) if hasattr(self.game, "anchor") else None
        return None if game_anchor is None else f"seat={self.seat}|{game_anchor}"

    def _info(self, opponent_moves: list[str]) -> dict[str, Any]:
        anchor = self.anchor()
        return self._game_info(opponent_moves) | ({} if anchor is None else {"anchor": anchor})

    def _game_info(self, opponent_moves: list[str]) -> dict[str, Any]:
        if self.free_text:
            outcome = self.game.outcome()
            mine = outcome is None and self.game.current_seat() == self.seat
            moves = self.game.legal_moves() if mine and hasattr(self.game, "legal_moves") else []
            return {
                "seat": self.seat,
                "legal_actions": moves,
                "opponent_moves": opponent_moves,
                "illegal_streak": self._illegal_streak,
                "result": None if outcome is None else float(outcome[self.seat]),
            }
        legal = self.game.legal_actions() if self.game.current_seat() == self.seat else []
        mask = [0] * self.game.num_actions
        for a in legal:
            mask[a] = 1
        outcome = self.game.outcome()
        names = [self.game.move_name(a) for a in legal]
        return {
            "seat": self.seat,
            "legal_actions": names,
            "legal_moves": names,
            "action_mask": mask,
            "opponent_moves": opponent_moves,
            "opponent_illegal": self._opponent_illegal,
            "illegal_streak": self._illegal_streak,
            "result": None if outcome is None else float(outcome[self.seat]),
        }

    def render_text(self) -> str:
        return self.game.render_text()
