"""SelfPlay: one seat of a game against random, scripted, perfect and callable opponents."""

import asyncio

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envhub
from envhub import SelfPlay


def perfect_agent(env: SelfPlay, rng) -> str:
    return env.game.move_name(env.game.solver_action(rng))


def play(env: SelfPlay, policy, seed: int) -> tuple[float, float]:
    """One game; returns (final result, return including penalties)."""
    _, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    total = 0.0
    while True:
        _, reward, terminated, truncated, info = env.step(policy(env, rng))
        total += reward
        if terminated or truncated:
            return info["result"], total


def test_perfect_tictactoe_never_loses_to_random_in_200_games():
    env = SelfPlay("TicTacToe-v0", opponent="random", seat="random")
    results = [play(env, perfect_agent, seed)[0] for seed in range(200)]
    assert min(results) >= 0.0
    assert results.count(1.0) > 150  # random play is beaten almost always
    assert {info_seat for info_seat in (env.reset(seed=s)[1]["seat"] for s in range(10))} == {0, 1}


def test_perfect_against_perfect_always_draws():
    for seat in (0, 1):
        env = SelfPlay("TicTacToe-v0", opponent="perfect", seat=seat)
        assert [play(env, perfect_agent, seed)[0] for seed in range(20)] == [0.0] * 20


def test_random_agent_loses_against_perfect_opponent():
    env = SelfPlay("TicTacToe-v0", opponent="perfect")
    pick = lambda env, rng: str(rng.choice(env.game.legal_moves()))
    results = [play(env, pick, seed)[0] for seed in range(30)]
    assert max(results) <= 0.0 and results.count(-1.0) > 20


def test_illegal_moves_are_readable_penalised_and_forfeit_after_max():
    env = SelfPlay("TicTacToe-v0", opponent="scripted", max_illegal=3)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("Z9")
    assert reward == pytest.approx(-0.1) and not terminated and info["illegal_move"]
    assert "Could not read a move in 'Z9'" in obs and "Legal moves: A1, B1, C1" in obs
    env.step("B2")
    obs, reward, terminated, _, _ = env.step("B2")  # occupied now
    assert "Illegal move 'B2'" in obs and reward == pytest.approx(-0.1) and not terminated
    obs, reward, terminated, _, info = env.step("nonsense")
    assert reward == pytest.approx(-0.1)
    obs, reward, terminated, _, info = env.step("<tool_call>{\"name\": \"jump\", \"arguments\": {}}</tool_call>")
    assert terminated and reward == -1.0 and info["forfeit"] and "forfeit" in obs
    with pytest.raises(envhub.ResetNeeded):
        env.step("A1")


def test_move_tool_call_and_prose_with_the_move_last():
    env = SelfPlay("ConnectFour-v0", opponent="scripted")
    _, info = env.reset(seed=0)
    assert info["tools"][0]["function"]["name"] == "move"
    obs, reward, *_ = env.step('<tool_call>{"name": "move", "arguments": {"move": "4"}}</tool_call>')
    assert reward == 0.0 and "R" in obs.splitlines()[-4]
    obs, reward, *_ = env.step("I will drop in the middle again:\n4")
    assert reward == 0.0 and "Legal moves" in obs
    env = SelfPlay("TicTacToe-v0", opponent="scripted")
    env.reset(seed=0)
    obs, *_ = env.step("Not A1; I'll take the centre: B2")
    assert "2  . X ." in obs


def test_callable_opponents_sync_and_async_receive_text_and_moves():
    seen = []

    def first_legal(text, legal):
        seen.append((text, legal))
        return legal[0]

    async def last_legal(text, legal):
        await asyncio.sleep(0)
        return legal[-1]

    env = SelfPlay("TicTacToe-v0", opponent=first_legal, seat=1)
    obs, _ = env.reset(seed=0)
    assert "Your opponent played A1" in obs and "Legal moves" in seen[0][0] and seen[0][1][0] == "A1"

    async def episode():
        env = SelfPlay("TicTacToe-v0", opponent=last_legal, seat=1)
        obs, _ = await env.areset(seed=0)
        return obs

    assert "Your opponent played C3" in asyncio.run(episode())


def test_callable_opponent_that_plays_illegally_falls_back_to_random():
    env = SelfPlay("TicTacToe-v0", opponent=lambda text, legal: "Z9", seat=1)
    _, info = env.reset(seed=0)
    assert info["opponent_illegal"] == 1 and len(info["opponent_moves"]) == 1


def test_kuhn_reward_is_chips_won():
    env = SelfPlay("KuhnPoker-v0", opponent="perfect", seat=0)
    returns = []
    for seed in range(300):
        env.reset(seed=seed)
        obs, reward, terminated, _, info = env.step("bet")
        while not terminated:
            obs, reward, terminated, _, info = env.step("call")
        assert reward in (-2.0, -1.0, 1.0, 2.0) and "Game over" in obs
        returns.append(reward)
    assert -0.6 < np.mean(returns) < 0.3  # always betting loses a little against the equilibrium


@pytest.mark.parametrize("env_id", ["TicTacToe-SelfPlay-v0", "ConnectFour-SelfPlay-v0", "KuhnPoker-SelfPlay-v0"])
def test_registered_self_play_ids_pass_gymnasium_check_env(env_id):
    env = gym.make(f"envhub/{env_id}")
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = envhub.make(env_id).reset(seed=3)
    assert "Your turn" in obs and info["legal_moves"]


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(envhub.ConfigError, match="unknown opponent"):
        SelfPlay("TicTacToe-v0", opponent="grandmaster")
    with pytest.raises(envhub.ConfigError, match="turn game"):
        SelfPlay("RockPaperScissors-v0")
    with pytest.raises(envhub.EnvNotFound):
        SelfPlay("TicTacToo-v0")


def test_self_play_takes_a_game_instance_and_is_deterministic():
    from envhub.envs.games.connect_four import ConnectFourEnv

    def trajectory():
        env = SelfPlay(ConnectFourEnv(depth=2), opponent="perfect", seat="random")
        obs, _ = env.reset(seed=11)
        observations = [obs]
        for move in ("4", "3", "5", "4", "2"):
            obs, _, terminated, *_ = env.step(move)
            observations.append(obs)
            if terminated:
                break
        return observations

    assert trajectory() == trajectory()
