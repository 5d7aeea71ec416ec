"""The multi-agent games: PettingZoo API, text moves, solvers, determinism."""

import itertools
import warnings

import numpy as np
import pytest
from pettingzoo.test import api_test

import envhub
from envhub.envs.games.connect_four import ConnectFourEnv
from envhub.envs.games.kuhn_poker import CARDS, GAME_VALUE_FIRST_PLAYER, KuhnPokerEnv, nash_bet_probability, payoff
from envhub.envs.games.tictactoe import TicTacToeEnv, minimax_value

GAME_IDS = ["TicTacToe-v0", "ConnectFour-v0", "KuhnPoker-v0"]  # turn-based (AEC)


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_passes_pettingzoo_api_test(env_id):
    env = envhub.make_multiagent(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # advice about dict observations, not failures
        api_test(env, num_cycles=200)


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_listed_with_multi_agent_tag_and_rejected_by_make(env_id):
    assert env_id in [s.id for s in envhub.list_envs(tag="multi-agent")]
    with pytest.raises(envhub.RegistrationError, match="make_multiagent"):
        envhub.make(env_id)


def play_random(env, seed):
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    texts = []
    for _agent in env.agent_iter():
        obs, _, terminated, truncated, info = env.last()
        texts.append(obs["text"])
        env.step(None if terminated or truncated else int(rng.choice(np.flatnonzero(info["action_mask"]))))
    return texts


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_same_seed_same_game(env_id):
    assert play_random(envhub.make_multiagent(env_id), 5) == play_random(envhub.make_multiagent(env_id), 5)


def test_text_observation_shows_board_turn_and_legal_moves():
    env = TicTacToeEnv()
    env.reset(seed=0)
    env.step(env.parse_move("B2"))
    text = env.observe("player_1")["text"]
    assert "2  . X ." in text and "Your turn" in text and "B2," not in text.split("Legal moves:")[1]
    assert env.infos["player_1"]["legal_moves"] == ["A1", "B1", "C1", "A2", "C2", "A3", "B3", "C3"]
    assert env.infos["player_0"]["action_mask"].sum() == 0


@pytest.mark.parametrize(
    "game, text, expected",
    [
        (TicTacToeEnv(), "B2", 4),
        (TicTacToeEnv(), "a3", 6),
        (TicTacToeEnv(), "3c", 8),
        (TicTacToeEnv(), "7", 6),
        (TicTacToeEnv(), "D4", None),
        (ConnectFourEnv(), "4", 3),
        (ConnectFourEnv(), "column 7", 6),
        (ConnectFourEnv(), "8", None),
        (KuhnPokerEnv(), "call", 1),
        (KuhnPokerEnv(), "Fold.", 0),
        (KuhnPokerEnv(), "raise?", 1),
        (KuhnPokerEnv(), "all in", None),
    ],
)
def test_parse_move(game, text, expected):
    assert game.parse_move(text) == expected


def test_tictactoe_perfect_value_is_a_draw_and_solver_wins_when_it_can():
    assert minimax_value((-1,) * 9, 0) == 0
    env = TicTacToeEnv()
    env.reset(seed=0)
    for cell in ("A1", "A2", "B1", "B2"):  # X: A1, B1; O: A2, B2 -> X to move wins at C1
        env.step(env.parse_move(cell))
    assert env.move_name(env.solver_action(np.random.default_rng(0))) == "C1"


def play_seats(env, players, seed):
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    while not env.game_over():
        env.step(players[env.current_seat()](env, rng))
    return env.outcome()


def solver(env, rng):
    return env.solver_action(rng)


def random_player(env, rng):
    return int(rng.choice(env.legal_actions()))


def scripted(env, rng):
    return env.scripted_action(rng)


def test_connect_four_search_beats_random_and_scripted():
    env = ConnectFourEnv()  # depth 4
    for seed in range(4):
        seat = seed % 2
        players = [random_player, random_player]
        players[seat] = solver
        assert play_seats(env, players, seed)[seat] == 1.0
        players[1 - seat] = scripted
        assert play_seats(env, players, seed)[seat] == 1.0


def test_connect_four_blocks_an_open_three():
    env = ConnectFourEnv()
    env.reset(seed=0)
    for col in (0, 6, 1, 6, 2):  # R threatens 4 in the bottom row
        env.step(col)
    assert env.solver_action(np.random.default_rng(0)) == 3


def test_kuhn_nash_strategy_has_the_known_game_value():
    def value(cards, history, alpha):
        won = payoff(cards, history)
        if won is not None:
            return won
        p = nash_bet_probability(cards[len(history) % 2], history, alpha)
        return p * value(cards, history + (1,), alpha) + (1 - p) * value(cards, history + (0,), alpha)

    for alpha in (0.0, 1 / 6, 1 / 3):
        expected = np.mean([value(cards, (), alpha) for cards in itertools.permutations(range(3), 2)])
        assert expected == pytest.approx(GAME_VALUE_FIRST_PLAYER)


def test_kuhn_hides_the_opponent_card_until_showdown():
    env = KuhnPokerEnv()
    env.reset(seed=2)
    mine, theirs = "JQK"[env.cards[0]], "JQK"[env.cards[1]]
    text = env.observe("player_0")["text"]
    assert f"Your card: {mine}" in text and "opponent had" not in text
    env.step(0)
    env.step(0)  # check, check: showdown
    assert f"opponent had {theirs}" in env.observe("player_0")["text"]


def test_cli_lists_games_with_the_multi_agent_tag(capsys):
    from envhub.cli.main import main

    assert main(["list", "--tag", "multi-agent"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "  " in line]  # table rows, not the notes below
    lines = [line for line in rows if not line.startswith("ta-")]  # TextArena's, when installed
    assert sorted(line.split()[0] for line in lines) == sorted(GAME_IDS + ["RockPaperScissors-v0"])
    assert all("multi-agent" in line for line in lines)
    assert main(["info", "KuhnPoker-v0"]) == 0
    assert "player_0, player_1" in capsys.readouterr().out


def test_rock_paper_scissors_passes_parallel_api_test_and_scores_rounds():
    from pettingzoo.test import parallel_api_test

    env = envhub.make_multiagent("RockPaperScissors-v0", rounds=3)
    parallel_api_test(env, num_cycles=10)
    obs, infos = env.reset(seed=0)
    assert infos["player_0"]["legal_moves"] == ["rock", "paper", "scissors"]
    moves = [("paper", "rock"), ("rock", "rock"), ("s", "Rock!")]
    totals = {"player_0": 0.0, "player_1": 0.0}
    for mine, theirs in moves:
        obs, rewards, terminations, _, infos = env.step(
            {"player_0": env.parse_move(mine), "player_1": env.parse_move(theirs)}
        )
        totals = {a: totals[a] + rewards[a] for a in totals}
    assert totals == {"player_0": 0.0, "player_1": 0.0} and all(terminations.values()) and env.agents == []
    assert "Round 1: you rock, opponent paper." in obs["player_1"] and "Score: you 1, opponent 1" in obs["player_1"]


def test_illegal_action_id_raises_with_the_legal_moves():
    env = TicTacToeEnv()
    env.reset(seed=0)
    env.step(4)
    with pytest.raises(ValueError, match="illegal action 4 for player_1; legal: A1, B1"):
        env.step(4)


def play_moves(env, moves):
    env.reset(seed=0)
    for move in moves:
        env.step(env.parse_move(move))
    return env.infos


def test_anchor_is_the_position_and_whose_turn_not_the_move_order():
    one_way = play_moves(TicTacToeEnv(), ["A1", "B1", "C1"])
    other_way = play_moves(TicTacToeEnv(), ["C1", "B1", "A1"])
    assert one_way["player_1"]["anchor"] == other_way["player_1"]["anchor"] == "board=XOX......|to_move=1"
    assert one_way["player_0"]["anchor"] == one_way["player_1"]["anchor"]  # nothing hidden: one anchor for both
    assert play_moves(TicTacToeEnv(), ["A1", "B1", "C2"])["player_1"]["anchor"] != one_way["player_1"]["anchor"]
    drops = play_moves(ConnectFourEnv(), ["1", "2", "3", "4"])["player_0"]["anchor"]
    assert drops == play_moves(ConnectFourEnv(), ["3", "4", "1", "2"])["player_0"]["anchor"]
    assert (
        drops.endswith("|to_move=0")
        and drops != play_moves(ConnectFourEnv(), ["1", "2", "4", "3"])["player_0"]["anchor"]
    )
    won = play_moves(TicTacToeEnv(), ["A1", "A2", "B1", "B2", "C1"])
    assert won["player_0"]["anchor"].endswith("|to_move=over")


def test_kuhn_poker_anchor_is_what_the_seat_knows():
    env = KuhnPokerEnv()
    infos = play_moves(env, ["check"])
    cards = [CARDS[c] for c in env.cards]
    assert infos["player_0"]["anchor"] == f"card={cards[0]}|bets=p|to_move=1"
    assert infos["player_1"]["anchor"] == f"card={cards[1]}|bets=p|to_move=1"  # the other card is never in it
    env.step(env.parse_move("bet"))
    assert env.infos["player_0"]["anchor"] == f"card={cards[0]}|bets=pb|to_move=0"


def test_self_play_anchor_keeps_its_seat_and_ignores_illegal_moves():
    env = envhub.SelfPlay("TicTacToe-v0", opponent="scripted", seat=1)
    obs, info = env.reset(seed=0)
    assert info["anchor"].startswith("seat=1|board=") and info["anchor"].endswith("|to_move=1")
    *_, after = env.step("this is no move")
    assert after["illegal_move"] and after["anchor"] == info["anchor"]
    legal = info["legal_moves"][0]
    *_, moved = env.step(legal)
    assert moved["anchor"] != info["anchor"]


def test_rock_paper_scissors_anchor_is_the_rounds_and_score_not_their_order():
    from envhub.envs.games.simultaneous import SimultaneousTurns

    def play(rounds):
        env = envhub.make_multiagent("RockPaperScissors-v0", rounds=3)
        _, infos = env.reset(seed=0)
        assert infos["player_0"]["anchor"] == "rounds=0|score=0:0"
        for mine, theirs in rounds:
            *_, infos = env.step({"player_0": env.parse_move(mine), "player_1": env.parse_move(theirs)})
        return infos["player_0"]["anchor"]

    won_then_lost = play([("paper", "rock"), ("rock", "paper")])
    assert won_then_lost == play([("rock", "paper"), ("paper", "rock")]) == "rounds=2|score=1:1"
    assert play([("paper", "rock"), ("paper", "rock")]) == "rounds=2|score=2:0"
    sealed = SimultaneousTurns(envhub.make_multiagent("RockPaperScissors-v0", rounds=3))
    sealed.reset(seed=0)
    sealed.step(2)  # player_0 commits scissors: the anchor says a move is sealed, never which
    assert sealed.anchor(1) == "rounds=0|score=0:0|sealed=0"
