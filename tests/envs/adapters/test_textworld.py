"""textworld-* ids: generated games cached atomically, the walkthrough expert winning its games, settings checked,
rewards that sum to the progress."""

import warnings

import pytest
from gymnasium.utils.env_checker import check_env

import envhub
from envhub.envs.adapters.textworld import game_path

pytest.importorskip("textworld", reason="needs textworld (make install: the lean textworld install)")
# One xdist worker for the file: it then parses TextWorld's grammars once (the first game of a process takes ~6 s
# more) and the games check_env generates are in its cache when the walkthrough plays them.
pytestmark = pytest.mark.xdist_group("textworld")
IDS = [s.id for s in envhub.list_envs(tag="textworld")]
# seeds check_env resets to: generating a game takes seconds, so the walkthrough test plays these games too
CHECKED_SEEDS = (123, 456)


@pytest.fixture(scope="module", autouse=True)
def game_cache(tmp_path_factory):
    """One game cache for this file: generating a game takes seconds, replaying it milliseconds."""
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("envhub-cache")
        patch.setenv("ENVHUB_CACHE_DIR", str(root))
        yield root


def test_one_id_per_challenge_of_the_installed_textworld():
    from textworld.challenges import CHALLENGES

    assert sorted(IDS) == sorted(f"textworld-{c.removeprefix('tw-')}-v0" for c in CHALLENGES)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", IDS)
def test_every_id_passes_check_env(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(envhub.make(env_id).unwrapped, skip_render_check=True)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", IDS)
def test_the_walkthrough_wins_the_checked_games_and_rewards_sum_to_progress(env_id):
    env = envhub.make(env_id)
    for seed in CHECKED_SEEDS:
        obs, info = env.reset(seed=seed)
        assert "$$$$" not in obs and info["progress"] == 0.0 and info["legal_actions"]
        total = 0.0
        for _ in range(200):
            action = env.unwrapped.oracle_action()
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            if terminated or truncated:
                break
        assert terminated and info["success"] and info["progress"] == 100.0
        assert total == pytest.approx(1.0)
    env.close()


def test_games_are_cached_under_the_cache_dir_and_replayed(game_cache):
    env = envhub.make("textworld-treasure_hunter-v0", level=1)
    first, info = env.reset(seed=11)
    assert first.startswith("Objective: ") and "-= " in first
    path = game_path("tw-treasure_hunter", info["settings"], 11)
    assert path.is_file() and path.with_suffix(".json").is_file() and str(path).startswith(str(game_cache))
    assert not list(path.parent.glob(".generating-*"))  # generated in a scratch dir, moved into place
    stamp = path.stat().st_mtime_ns
    again, _ = env.reset(seed=11)
    assert again == first and path.stat().st_mtime_ns == stamp  # replayed, not generated again
    obs, reward, terminated, truncated, info = env.step("dance with the \\ backslash é中")
    assert isinstance(obs, str) and reward == 0.0 and not terminated
    env.close()


def test_following_a_command_off_the_walkthrough_ends_the_experts_advice():
    env = envhub.make("textworld-coin_collector-v0", level=2)
    env.reset(seed=3)
    assert env.unwrapped.oracle_action() is not None
    env.step("inventory")
    assert env.unwrapped.oracle_action() is None


def test_settings_are_checked_against_the_challenges_own():
    with pytest.raises(envhub.ConfigError, match="no setting 'recipes'"):
        envhub.make("textworld-cooking-v0", recipes=2)
    with pytest.raises(envhub.ConfigError, match="must be one of"):
        envhub.make("textworld-cooking-v0", go=5)
    with pytest.raises(envhub.ConfigError, match="over 100 rooms"):
        envhub.make("textworld-coin_collector-v0", level=180)
    with pytest.raises(envhub.ConfigError, match="must be an integer"):
        envhub.make("textworld-treasure_hunter-v0", level="high")
    with pytest.raises(envhub.ConfigError, match="must be true or false"):
        envhub.make("textworld-simple-v0", test="yes")


def test_anchor_is_the_worlds_facts_not_the_commands_that_led_there():
    env = envhub.make("textworld-simple-v0")
    _, info = env.reset(seed=3)
    start = info["anchor"]
    container = next(c.removeprefix("open ") for c in info["legal_actions"] if c.startswith("open "))
    for command in ("look", "inventory", "xyzzy"):  # nothing in the world changes
        assert env.step(command)[4]["anchor"] == start
    opened = env.step(f"open {container}")[4]["anchor"]
    assert opened != start
    assert env.step(f"close {container}")[4]["anchor"] == start  # open then close: the world as it was
    env.close()
