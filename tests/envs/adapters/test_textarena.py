"""ta-* ids: one-player games as AgentEnvs, multi-player ones as PettingZoo AEC envs playable with SelfPlay; TextArena's
rewards kept."""

import sys

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import api_test

import envhub
from envhub.envs.adapters.family import AdapterUnavailable
from envhub.envs.adapters.textarena import TextArenaGame, envhub_id, message_text

ta = pytest.importorskip("textarena", reason="needs textarena (pip install 'envhub[textarena]')")


def test_ids_follow_envhub_form():
    assert envhub_id("Sokoban-v0-medium") == "ta-Sokoban-medium-v0"
    assert envhub_id("TicTacToe-v0") == "ta-TicTacToe-v0"
    assert envhub_id("Taboo-v0-city/country") == "ta-Taboo-city_country-v0"


@pytest.mark.parametrize(
    "env_id", ["ta-GuessTheNumber-v0", "ta-Minesweeper-raw-v0", "ta-Sokoban-v0", "ta-TowerOfHanoi-v0"]
)
def test_one_player_games_pass_check_env(env_id):
    env = envhub.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)


def test_same_observations_and_reward_as_textarena_itself():
    ours = envhub.make("ta-GuessTheNumber-raw-v0")
    theirs = ta.make("GuessTheNumber-v0-raw")
    obs, _ = ours.reset(seed=4)
    theirs.reset(num_players=1, seed=4)
    assert obs == message_text(theirs.get_observation()[1])
    low, high = 1, 20
    for _ in range(30):
        guess = (low + high) // 2
        obs, reward, terminated, _, _ = ours.step(f"[{guess}]")
        done, _ = theirs.step(f"[{guess}]")
        assert terminated == done
        if done:
            rewards, _ = theirs.close()
            assert reward == float(rewards[0]) and reward > 0  # binary search wins
            return
        assert obs == message_text(theirs.get_observation()[1])
        if "higher" in obs.lower():
            low = guess + 1
        else:
            high = guess - 1
    pytest.fail("binary search did not finish")


@pytest.mark.parametrize("env_id", ["ta-TicTacToe-v0", "ta-ConnectFour-raw-v0", "ta-SecretMafia-v0"])
def test_multi_player_games_pass_pettingzoo_api_test(env_id):
    game = envhub.make_multiagent(env_id)
    api_test(game, num_cycles=12)


def test_selfplay_plays_a_textarena_game_to_its_result():
    env = envhub.SelfPlay("ta-TicTacToe-raw-v0", opponent="random")
    rng = np.random.default_rng(0)
    results = []
    for seed in range(4):
        obs, info = env.reset(seed=seed)
        assert "Available Moves" in obs and info["seat"] == 0
        for _ in range(30):
            obs, reward, terminated, truncated, info = env.step(env.game.random_move(rng))
            if terminated:
                break
        assert terminated and reward == info["result"] == env.game.outcome()[0]
        results.append(reward)
    assert set(results) <= {-1.0, 0.0, 1.0}


def test_selfplay_with_a_callable_opponent_sees_its_own_observation():
    seen = []

    def opponent(text, legal):
        seen.append(text)
        return "[4]" if "[4]" in text.split("Available Moves")[-1] else "[0]"

    env = envhub.SelfPlay("ta-TicTacToe-raw-v0", opponent=opponent, seat=1)
    obs, info = env.reset(seed=1)
    assert seen and info["opponent_moves"] == ["[4]"] and "Available Moves" in obs


def test_games_that_download_or_call_hosted_llms_are_refused_in_one_line(monkeypatch):
    import nltk

    from envhub.errors import EnvUnavailable

    monkeypatch.setattr(nltk.data, "path", ["/nonexistent"])  # even where NLTK data exists, envhub never fetches it
    with pytest.raises(EnvUnavailable, match="nltk.downloader") as caught:
        envhub.make("ta-Wordle-v0")
    assert "\n" not in str(caught.value)
    with pytest.raises(EnvUnavailable, match="OpenRouter"):
        envhub.make_multiagent("ta-Debate-v0")
    # made directly (not through envhub.make's check of the spec), the adapter refuses the same way
    with pytest.raises(AdapterUnavailable, match="OpenRouter"):
        TextArenaGame(ta_id="Debate-v0", num_players=2, needs=["openrouter"])


def test_list_marks_what_cannot_run_offline_and_info_says_why():
    from envhub.availability import unavailable

    assert "OpenRouter" in unavailable(envhub.spec("ta-Debate-v0"))
    if sys.version_info < (3, 12):  # 3.12 f-strings in its source
        assert unavailable(envhub.spec("ta-Checkers-v0")).startswith("needs python>=3.12")
    assert unavailable(envhub.spec("ta-TicTacToe-v0")) == ""
