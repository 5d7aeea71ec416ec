"""The registry: ids, suggestions, gymnasium namespace, custom envs in one call."""

import gymnasium as gym
import pytest

import envhub
from envhub import AgentEnv


class Echo(AgentEnv):
    """A minimal env: echoes the action back, ends after `limit` steps."""

    def __init__(self, limit: int = 3):
        self.limit = limit
        self.turns = 0

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        self.turns = 0
        return "say something", info

    def step(self, action):
        self.turns += 1
        return f"you said: {action}", 1.0, self.turns >= self.limit, False, {}


def test_register_then_make_through_both_apis():
    envhub.register("EchoTest-v0", Echo, kwargs={"limit": 2}, tags=("test",))
    assert "EchoTest-v0" in [s.id for s in envhub.list_envs(tag="test")]
    for env in (envhub.make("EchoTest-v0"), gym.make("envhub/EchoTest-v0")):
        obs, info = env.reset(seed=0)
        assert obs == "say something" and info["tools"] == []
        assert env.step("hi")[0] == "you said: hi"
        assert env.step("bye")[2] is True


def test_unknown_id_suggests_the_closest():
    with pytest.raises(envhub.EnvNotFound) as err:
        envhub.make("Sokobn-v0")
    assert "Sokoban-v0" in str(err.value)


def test_async_methods_reach_a_sync_env_through_wrappers():
    envhub.register("EchoAsync-v0", Echo, max_episode_steps=2)
    env = envhub.make("EchoAsync-v0", limit=10)

    async def episode():
        await env.areset(seed=1)
        first = await env.astep("a")
        second = await env.astep("b")
        return first, second

    first, second = envhub.run_sync(episode())
    assert first[3] is False and second[3] is True  # truncated by max_episode_steps


@pytest.mark.parametrize("bad_id", ["no-version", "9Starts-v0", ""])
def test_register_rejects_malformed_ids(bad_id):
    with pytest.raises(envhub.RegistrationError):
        envhub.register(bad_id, Echo)
