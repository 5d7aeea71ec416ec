"""gem-* ids: GEM's text, rewards and episode ends pass through unchanged; its python tool runs under bwrap; hub
datasets are refused."""

import random
import shutil

import pytest
from gymnasium.utils.env_checker import check_env

import envhub
from envhub.envs.adapters.family import AdapterUnavailable

gem = pytest.importorskip("gem", reason="needs gem-llm (see docs/adapters.md)")


@pytest.mark.parametrize(
    "env_id, gem_id, actions",
    [
        (
            "gem-game-GuessTheNumber-easy-v0",
            "game:GuessTheNumber-v0-easy",
            [r"\boxed{5}", r"\boxed{3}", r"\boxed{8}", r"\boxed{1}"],
        ),
        (
            "gem-game-Sokoban-easy-v0",
            "game:Sokoban-v0-easy",
            [r"\boxed{up}", r"\boxed{left}", "no box", r"\boxed{down}"],
        ),
        ("gem-rg-basic_arithmetic-v0", "rg:basic_arithmetic", [r"\boxed{12}"]),
    ],
)
def test_same_trajectory_as_gem_itself(env_id, gem_id, actions):
    ours, theirs = envhub.make(env_id), gem.make(gem_id)
    assert ours.reset(seed=4)[0] == theirs.reset(seed=4)[0]
    for action in actions:
        obs, reward, terminated, truncated, info = ours.step(action)
        gem_obs, gem_reward, gem_terminated, gem_truncated, _ = theirs.step(action)
        assert (obs, reward, terminated) == (gem_obs, gem_reward, gem_terminated)
        assert truncated == (gem_truncated and not gem_terminated) and info["gem_truncated"] == gem_truncated
        if terminated or truncated:
            break
    check_env(ours.unwrapped, skip_render_check=True)


def test_construction_draws_one_room_and_leaves_the_callers_random_stream_alone():
    """GEM's random-size Sokoban resets once in its constructor, unseeded, from Python's global `random` (the 8x8
    pick took up to 90 s to search): the adapter constructs it from a fixed draw and puts the caller's state back."""
    random.seed(123)
    expected = [random.random() for _ in range(3)]
    random.seed(123)
    envs = [envhub.make("gem-game-Sokoban-random-v0") for _ in range(2)]
    assert [random.random() for _ in range(3)] == expected
    assert [env.unwrapped.env.unwrapped.dim_room for env in envs] == [(6, 6), (6, 6)]
    # episodes come from the reset's seed, as before (seed 3: a quick level; see test_every_adapted_id.py)
    first, second = (env.reset(seed=3)[0] for env in envs)
    assert first == second


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_python_tool_wrapper_runs_code_sandboxed():
    env = envhub.make("gem-game-GuessTheNumber-easy-v0", tools=["python"])
    obs, _ = env.reset(seed=0)
    assert "<python>" in obs
    obs, reward, terminated, _, info = env.step("<python>print(6 * 7)</python>")
    assert "42" in obs and info["tool_type"] == "python_code" and not terminated
    with pytest.raises(envhub.ConfigError, match="unknown GEM tool"):
        envhub.make("gem-game-GuessTheNumber-easy-v0", tools=["search"])


def test_hub_datasets_and_nltk_downloads_are_refused_in_one_line():
    from envhub.envs.adapters.gem import GemEnv
    from envhub.errors import EnvUnavailable

    with pytest.raises(EnvUnavailable, match="huggingface-cli download") as caught:  # envhub.make checks `requires`
        envhub.make("gem-math-GSM8K-v0")
    assert "\n" not in str(caught.value)
    with pytest.raises(AdapterUnavailable, match="cannot load its data offline"):  # made directly: GEM's own failure
        GemEnv("math:GSM8K")
    with pytest.raises(EnvUnavailable, match="nltk"):
        envhub.make("gem-game-Wordle-easy-v0").reset(seed=0)


def test_envs_that_need_a_hub_dataset_or_nltk_words_are_marked_until_the_data_is_local(tmp_path, monkeypatch):
    from envhub.availability import problem, unavailable

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    problem.cache_clear()
    try:
        assert "Hugging Face dataset 'axon-rl/GSM-8k'" in unavailable(envhub.spec("gem-math-GSM8K-v0"))
        assert "nltk:words" in envhub.spec("gem-game-Wordle-easy-v0").requires
        assert unavailable(envhub.spec("gem-game-Sokoban-easy-v0")) == ""
        (tmp_path / "datasets--axon-rl--GSM-8k").mkdir()  # fetched once where the internet was reachable
        problem.cache_clear()
        assert unavailable(envhub.spec("gem-math-GSM8K-v0")) == ""
    finally:
        problem.cache_clear()
