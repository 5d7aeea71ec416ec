"""Every registered single-agent env passes gymnasium's checker; the bundled games are seeded and robust to bad
actions."""

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envhub

# Every env envhub ships (test files register throwaway envs of their own, with source "user").
SINGLE_AGENT_IDS = [s.id for s in envhub.list_envs() if not s.multiagent and s.source == "envhub"]
BUNDLED = ["Sokoban-v0", "FrozenLake-v0", "Wordle-v0", "Math-v0"]
# a few replies each env understands, to drive two copies along the same trajectory
SCRIPTS = {
    "Sokoban-v0": ["left", "up", "right", "down", "down", "left"],
    "FrozenLake-v0": ["right", "down", "down", "right"],
    "Wordle-v0": ["[crane]", "[moist]", "[plumb]", "[fight]"],
    "Math-v0": ["The answer is \\boxed{12}"],
}
# how each env asks for a well-formed action; the fix must be in the observation
FORMAT_HINTS = {
    "Sokoban-v0": "up, down, left or right",
    "FrozenLake-v0": "up, down, left or right",
    "Wordle-v0": "[crane]",
    "Math-v0": "\\boxed{",
}


@pytest.mark.parametrize("env_id", SINGLE_AGENT_IDS)
def test_gymnasium_check_env_passes(env_id):
    env = gym.make(f"envhub/{env_id}")
    try:
        check_env(env.unwrapped, skip_render_check=False)
    finally:
        env.close()


def test_gym_make_after_import_envhub():
    env = gym.make("envhub/Sokoban-v0")
    obs, info = env.reset(seed=0)
    assert "Legend" in obs and info["tools"][0]["function"]["name"] == "move"
    assert env.spec.max_episode_steps == 120


@pytest.mark.parametrize("env_id", BUNDLED)
def test_same_seed_same_trajectory_and_different_seeds_differ(env_id):
    def rollout(seed):
        env = envhub.make(env_id)
        trace = [env.reset(seed=seed)[0]]
        for action in SCRIPTS[env_id]:
            obs, reward, terminated, truncated, _ = env.step(action)
            trace.append((obs, reward, terminated))
            if terminated or truncated:
                break
        return trace

    assert rollout(7) == rollout(7)
    assert len({repr(rollout(seed)) for seed in range(5)}) > 1


@pytest.mark.parametrize("env_id", BUNDLED)
def test_reset_info_has_prompt_tools_and_documented_reward(env_id):
    env = envhub.make(env_id)
    obs, info = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    assert info["system_prompt"] and info["tools"] and info["success"] is False
    unwrapped = env.unwrapped
    assert "1.0" in unwrapped.reward_doc and "Reward" in type(unwrapped).__doc__
    assert env.render() == unwrapped.render_text() != ""


BAD_ACTIONS = {
    "empty": ("", "(empty)"),
    "huge": ("a" * 100_000, "the limit is"),
    "malformed tool call": ('<tool_call>{"name": "move", "arguments": {</tool_call>', "not valid JSON"),
    "unknown tool": ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown tool 'rm_rf'"),
    "non-UTF-8 bytes": (b"\xff\xfe\xfa up [crane] 12", "not valid UTF-8"),
    "missing argument": ('<tool_call>{"name": "%s", "arguments": {}}</tool_call>', "missing required argument"),
}


@pytest.mark.parametrize("case", sorted(BAD_ACTIONS))
@pytest.mark.parametrize("env_id", BUNDLED)
def test_bad_actions_give_readable_observations_and_the_episode_goes_on(env_id, case):
    env = envhub.make(env_id)
    env.reset(seed=3)
    action, expected = BAD_ACTIONS[case]
    if case == "missing argument":
        tool = env.unwrapped.tools[0]
        action = action % tool.name
        if not tool.parameters["required"]:  # e.g. submit(answer="") is a valid call with an empty answer
            expected = FORMAT_HINTS[env_id]
    obs, reward, terminated, truncated, info = env.step(action)
    assert expected in obs
    assert env.observation_space.contains(obs) and len(obs) < 5_000
    assert reward == 0.0 and not terminated and not truncated
    assert info["invalid_action"] is True
    if case == "empty":
        assert FORMAT_HINTS[env_id] in obs  # the fix is spelled out
    # the episode continues and a good action still works afterwards
    obs, *_ = env.step(SCRIPTS[env_id][0])
    assert env.observation_space.contains(obs)
