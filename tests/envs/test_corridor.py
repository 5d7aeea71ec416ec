"""Corridor-v0: the move rule, arrival, the turn limit and the anchor (the square, nothing else)."""

import pytest

import envhub
from envhub.envs.corridor import CorridorEnv, first_letter


def test_a_reply_moves_when_its_first_letter_is_in_the_squares_half_of_the_alphabet():
    assert first_letter("  42 apples") == "a" and first_letter("...") == ""
    env = CorridorEnv(length=2, max_turns=4, alternate=True)
    _, info = env.reset(seed=0)
    assert info["anchor"] == "square=0" and info["position"] == 0
    _, reward, terminated, truncated, info = env.step("Zebra")  # n-z: the turn is wasted
    assert (reward, terminated, truncated, info["moved"]) == (0.0, False, False, False)
    assert info["anchor"] == "square=0"  # a wasted turn leaves the state, and its anchor, as they were
    _, reward, terminated, _, info = env.step("hello")
    assert (reward, terminated, info["anchor"]) == (0.0, False, "square=1")
    _, _, _, _, info = env.step("Apple")  # odd square: a-m wastes the turn here
    assert not info["moved"] and info["anchor"] == "square=1"
    _, reward, terminated, _, info = env.step("zebra")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert "odd square" in env.system_prompt
    plain = CorridorEnv(length=2, max_turns=2)
    plain.reset(seed=0)
    assert plain.step("apple")[4]["moved"] and plain.step("apple")[2]  # a-m moves on every square


def test_the_turn_limit_truncates_without_reward():
    env = envhub.make("Corridor-v0", length=2, max_turns=2)
    env.reset(seed=0)
    env.step("a")
    _, reward, terminated, truncated, info = env.step("zzz")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)


@pytest.mark.parametrize(
    "kwargs, message", [({"length": 0}, "at least 1"), ({"length": 4, "max_turns": 3}, "max_turns")]
)
def test_bad_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CorridorEnv(**kwargs)


def test_the_demonstrator_wastes_its_share_of_turns_from_the_seeded_rng():
    env = CorridorEnv(length=4, max_turns=64, demo_waste=0.25)
    env.reset(seed=3)
    replies = [env.oracle_action() for _ in range(400)]
    assert set(replies) == {"go", "wait"} and 0.18 < replies.count("wait") / 400 < 0.32
    env.reset(seed=3)
    assert [env.oracle_action() for _ in range(400)] == replies
    assert CorridorEnv(length=4, max_turns=8).oracle_action() == "go"  # demo_waste 0: the best play
    with pytest.raises(ValueError, match=r"demo_waste .* in \[0, 1\)"):
        CorridorEnv(demo_waste=1.0)
