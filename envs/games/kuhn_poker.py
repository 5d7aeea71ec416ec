"""Kuhn poker as a PettingZoo AEC env: a game of hidden information, with its Nash equilibrium player.

Three cards (J < Q < K); each player antes 1 chip and gets one card the other cannot see.
player_0 acts first: "check" or "bet" (1 chip); facing a bet a player may "fold" or "call".
Higher card wins at showdown. Reward: the chips won or lost (+-1 or +-2). The equilibrium
player follows Kuhn's family of Nash strategies (parameter `alpha` in [0, 1/3]); the first
player's expected winnings against it are -1/18 chip per hand whatever they do best.

A seat's anchor is its information state (its card and the bets), as hidden information must stay hidden: the
episodes a trainer groups share their seed, hence the deal, so it names their exact state.
"""

from __future__ import annotations

import re

import numpy as np

from envhub.envs.games.base import TurnGame

CARDS = ("J", "Q", "K")
PASS, BET = 0, 1
GAME_VALUE_FIRST_PLAYER = -1.0 / 18.0
_PASS_WORDS = re.compile(r"^\s*(check|fold|pass)\b", re.IGNORECASE)
_BET_WORDS = re.compile(r"^\s*(bet|call|raise)\b", re.IGNORECASE)


def nash_bet_probability(card: int, history: tuple[int, ...], alpha: float = 0.0) -> float:
    """Probability that the equilibrium player bets/calls holding `card` after `history`."""
    if history == ():  # first player opens
        return (alpha, 0.0, 3 * alpha)[card]
    if history == (PASS, BET):  # first player facing a bet after checking
        return (0.0, alpha + 1.0 / 3.0, 1.0)[card]
    if history == (BET,):  # second player facing a bet
        return (0.0, 1.0 / 3.0, 1.0)[card]
    if history == (PASS,):  # second player after a check
        return (1.0 / 3.0, 0.0, 1.0)[card]
    raise ValueError(f"no decision after history {history}")


def payoff(cards: tuple[int, int], history: tuple[int, ...]) -> float | None:
    """Chips won by player_0 once `history` ends the hand, else None."""
    showdown = 1.0 if cards[0] > cards[1] else -1.0
    return {
        (PASS, PASS): showdown,
        (BET, PASS): 1.0,
        (BET, BET): 2 * showdown,
        (PASS, BET, PASS): -1.0,
        (PASS, BET, BET): 2 * showdown,
    }.get(history)


class KuhnPokerEnv(TurnGame):
    """One hand of Kuhn poker: one hidden card each, one betting round."""

    reward_doc = (
        "when the hand ends, the chips each seat won (+) or lost (-): the ante, plus the bet if one was "
        "called; 0 on other turns."
    )
    metadata = {**TurnGame.metadata, "name": "kuhn_poker_v0"}
    num_actions = 2
    observation_shape = (6,)
    move_help = "one word: check or bet (fold or call when facing a bet)"

    def __init__(self, render_mode: str | None = None, alpha: float = 0.0) -> None:
        super().__init__(render_mode)
        if not 0.0 <= alpha <= 1.0 / 3.0:
            raise ValueError(f"alpha must lie in [0, 1/3], got {alpha}")
        self.alpha = alpha

    def _new_state(self) -> None:
        deal = self.rng.permutation(3)
        self.cards = (int(deal[0]), int(deal[1]))
        self.bets: list[int] = []

    def current_seat(self) -> int:
        return len(self.bets) % 2

    def legal_actions(self) -> list[int]:
        return [] if self._outcome() is not None else [PASS, BET]

    def _apply(self, action: int) -> None:
        self.bets.append(action)

    def _outcome(self) -> tuple[float, float] | None:
        won = payoff(self.cards, tuple(self.bets))
        return None if won is None else (won, -won)

    def facing_bet(self) -> bool:
        """True when the player to move must fold or call."""
        return bool(self.bets) and self.bets[-1] == BET

    def move_name(self, action: int) -> str:
        if self.facing_bet():
            return ("fold", "call")[action]
        return ("check", "bet")[action]

    def parse_move(self, text: str) -> int | None:
        if _PASS_WORDS.match(text):
            return PASS
        if _BET_WORDS.match(text):
            return BET
        return None

    def seat_name(self, seat: int) -> str:
        return f"player_{seat}" + (" (first to act)" if seat == 0 else " (second to act)")

    def _betting_text(self) -> str:
        words, facing = [], False
        for i, action in enumerate(self.bets):
            word = ("folds", "calls")[action] if facing else ("checks", "bets")[action]
            words.append(f"player_{i % 2} {word}")
            facing = action == BET and not facing
        return ", ".join(words) if words else "no actions yet"

    def board_text(self, seat: int) -> str:
        pot = 2 + sum(self.bets)
        lines = ["Kuhn poker: cards J < Q < K, each player antes 1 chip, one betting round."]
        if seat == -1:
            lines.append(f"Cards: player_0 {CARDS[self.cards[0]]}, player_1 {CARDS[self.cards[1]]}.")
        else:
            lines.append(f"Your card: {CARDS[self.cards[seat]]}.")
            if self._outcome() is not None and tuple(self.bets) not in ((BET, PASS), (PASS, BET, PASS)):
                lines.append(f"Showdown: your opponent had {CARDS[self.cards[1 - seat]]}.")
        lines.append(f"Betting: {self._betting_text()}. Pot: {pot} chips.")
        return "\n".join(lines)

    def position(self, seat: int) -> str:
        """The seat's own card and the bets so far (their order is the game: check-bet is not bet-check); the other
        card stays out, so an anchor never tells a seat what it may not see."""
        return f"card={CARDS[self.cards[seat]]}|bets=" + "".join(("p", "b")[action] for action in self.bets)

    def observe_array(self, seat: int) -> np.ndarray:
        encoded = np.zeros(6, dtype=np.int8)
        encoded[self.cards[seat]] = 1
        for i, action in enumerate(self.bets):
            encoded[3 + i] = 1 + action
        return encoded

    def solver_action(self, rng: np.random.Generator) -> int:
        """Sample from the Nash equilibrium strategy, seeing only the acting seat's card."""
        card = self.cards[self.current_seat()]
        return BET if rng.random() < nash_bet_probability(card, tuple(self.bets), self.alpha) else PASS

    def scripted_action(self, rng: np.random.Generator) -> int:
        """Bet or call with a king; call a bet with a queen; otherwise check or fold."""
        card = self.cards[self.current_seat()]
        if card == 2:
            return BET
        return BET if card == 1 and self.facing_bet() else PASS
