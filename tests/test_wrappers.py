"""Wrappers run on both paths: what `env.step` does, `await env.astep` does, through training, eval and serve."""

from __future__ import annotations

import functools

import gymnasium as gym
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit, TransformObservation, TransformReward

import envhub
from envhub import AgentEnv, RegistrationError, RemoteEnv


class Counter(AgentEnv):
    """Sync only: reward 1 for the action "up", 0 otherwise; ends after `goal` ups."""

    system_prompt = "Say up."

    def __init__(self, goal: int = 3):
        self.goal = goal

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        self.ups = 0
        return "count 0", info

    def step(self, action):
        self.ups += action.strip() == "up"
        return f"count {self.ups}", float(action.strip() == "up"), self.ups >= self.goal, False, {}


class AsyncCounter(AgentEnv):
    """The same game written async-first, as sandboxed envs are."""

    system_prompt = "Say up."

    def __init__(self, goal: int = 3):
        self.goal = goal

    async def areset(self, *, seed=None, options=None):
        _, info = await super().areset(seed=seed)
        self.ups = 0
        return "count 0", info

    async def astep(self, action):
        self.ups += action.strip() == "up"
        return f"count {self.ups}", float(action.strip() == "up"), self.ups >= self.goal, False, {}


tenfold = functools.partial(TransformReward, func=lambda r: 10 * r)
shout = functools.partial(TransformObservation, func=str.upper, observation_space=None)


class Downcase(gym.ActionWrapper):
    def action(self, action):
        return action.lower()


class Bonus(envhub.Wrapper):
    """An envhub wrapper written only async: the sync path runs it too."""

    async def astep(self, action):
        obs, reward, terminated, truncated, info = await super().astep(action)
        return obs, reward + 0.5, terminated, truncated, {**info, "bonus": 0.5}


class SyncOnlyBonus(envhub.Wrapper):
    """An envhub wrapper that overrides only the sync step: its astep would pass through, skipping it."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward + 0.5, terminated, truncated, info


class OwnStep(gym.Wrapper):
    """A wrapper with only the sync API and a step of its own: the async path cannot run it."""

    def step(self, action):
        return self.env.step(action)


envhub.register("WrapCounter-v0", Counter, tags=("test",))
envhub.register("WrapAsyncCounter-v0", AsyncCounter, tags=("test",))
envhub.register("WrapLimited-v0", AsyncCounter, kwargs={"goal": 10}, max_episode_steps=2, tags=("test",))
envhub.register("WrapShaped-v0", AsyncCounter, wrappers=[tenfold, shout, Bonus], tags=("test",))
IDS = ["WrapCounter-v0", "WrapAsyncCounter-v0"]


def play_sync(env, actions, seed=0):
    steps = [env.reset(seed=seed)]
    steps += [env.step(a) for a in actions]
    return steps


async def play_async(env, actions, seed=0):
    steps = [await env.areset(seed=seed)]
    steps += [await env.astep(a) for a in actions]
    return steps


def without_times(steps):
    """Episode statistics carry a wall time that differs between any two runs."""
    out = []
    for step in steps:
        info = step[-1]
        if "episode" in info:
            info = {**info, "episode": {k: v for k, v in info["episode"].items() if k != "t"}}
        out.append((*step[:-1], info))
    return out


@pytest.mark.parametrize("env_id", IDS)
@pytest.mark.parametrize(
    "wrappers",
    [[tenfold], [shout], [Downcase], [Bonus], [RecordEpisodeStatistics], [tenfold, shout, Downcase, Bonus]],
    ids=[
        "TransformReward",
        "TransformObservation",
        "ActionWrapper",
        "envhub.Wrapper",
        "RecordEpisodeStatistics",
        "all",
    ],
)
async def test_every_wrapper_acts_the_same_on_both_paths(env_id, wrappers):
    actions = ["UP", "up", "down", "up", "up"]
    sync_steps = play_sync(envhub.make(env_id, wrappers=wrappers), actions)
    async_steps = await play_async(envhub.make(env_id, wrappers=wrappers), actions)
    plain = play_sync(envhub.make(env_id), actions)
    assert without_times(async_steps) == without_times(sync_steps) != without_times(plain)


async def test_transforms_are_applied_to_the_async_result():
    env = envhub.make("WrapAsyncCounter-v0", wrappers=[tenfold, shout, Downcase, Bonus])
    obs, _ = await env.areset(seed=0)
    assert obs == "COUNT 0"
    obs, reward, terminated, truncated, info = await env.astep("UP")  # Downcase makes it "up"
    assert (obs, reward, terminated, truncated, info) == ("COUNT 1", 10.5, False, False, {"bonus": 0.5})


async def test_record_episode_statistics_counts_async_episodes():
    env = envhub.make("WrapAsyncCounter-v0", wrappers=[RecordEpisodeStatistics])
    for _ in range(2):
        await env.areset(seed=0)
        for action in ("up", "no", "up", "up"):
            *_, terminated, _, info = await env.astep(action)
    assert terminated and info["episode"]["r"] == 3.0 and info["episode"]["l"] == 4
    stats = env.env
    assert stats.episode_count == 2 and list(stats.return_queue) == [3.0, 3.0]


async def test_the_specs_time_limit_truncates_the_async_path_like_the_sync_one():
    sync_steps = play_sync(envhub.make("WrapLimited-v0"), ["up", "up"])
    async_steps = await play_async(envhub.make("WrapLimited-v0"), ["up", "up"])
    assert async_steps == sync_steps and [s[3] for s in async_steps[1:]] == [False, True]
    env = envhub.make("WrapLimited-v0", wrappers=[functools.partial(TimeLimit, max_episode_steps=1)])
    await env.areset(seed=0)
    assert (await env.astep("up"))[3] is True  # a user's own, tighter TimeLimit


async def test_stepping_before_reset_fails_on_the_async_path_as_on_the_sync_one():
    with pytest.raises(ResetNeeded):
        envhub.make("WrapAsyncCounter-v0").step("up")
    with pytest.raises(ResetNeeded):
        await envhub.make("WrapAsyncCounter-v0").astep("up")


async def test_registered_wrappers_apply_to_make_gym_make_and_the_async_path():
    for env in (envhub.make("WrapShaped-v0"), gym.make("envhub/WrapShaped-v0")):
        assert env.reset(seed=0)[0] == "COUNT 0" and env.step("up")[1] == 10.5
    env = envhub.make("WrapShaped-v0")
    assert (await env.areset(seed=0))[0] == "COUNT 0" and (await env.astep("up"))[1] == 10.5


def test_a_wrapper_that_overrides_step_is_refused_at_make_naming_it_and_the_fix():
    with pytest.raises(RegistrationError, match=r"OwnStep overrides step\(\) or reset\(\)") as caught:
        envhub.make("WrapCounter-v0", wrappers=[tenfold, OwnStep])
    assert "envhub.wrappers.Wrapper" in caught.value.hint and "RewardWrapper" in caught.value.hint
    with pytest.raises(RegistrationError, match="SyncOnlyBonus"):
        envhub.make("WrapCounter-v0", wrappers=[SyncOnlyBonus])
    envhub.register("WrapRefused-v0", Counter, wrappers=[OwnStep], tags=("test",))
    with pytest.raises(RegistrationError, match="OwnStep"):
        envhub.make("WrapRefused-v0")


def test_bad_wrappers_are_refused_with_the_fix():
    with pytest.raises(RegistrationError, match="must be callables") as caught:
        envhub.register("WrapBad-v0", Counter, wrappers=["TransformReward"])
    assert "functools.partial" in caught.value.hint
    with pytest.raises(RegistrationError, match="returned int, not an env"):
        envhub.make("WrapCounter-v0", wrappers=[lambda env: 3])


async def test_a_gymnasium_wrapper_around_a_made_env_runs_on_the_async_path():
    env = envhub.as_async(TransformReward(envhub.make("WrapAsyncCounter-v0"), lambda r: -r))
    await env.areset(seed=0)
    assert (await env.astep("up"))[1] == -1.0
    assert envhub.as_async(env) is env
    with pytest.raises(RegistrationError, match="OwnStep"):
        envhub.as_async(OwnStep(envhub.make("WrapCounter-v0")))


async def test_the_rollout_sees_the_wrapped_rewards():
    from envhub.trainer.config import RolloutConfig
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.models import load_tokenizer, tiny_llama
    from envhub.trainer.rollout.worker import RolloutWorker

    tokenizer = load_tokenizer("tiny")
    engine = EmbeddedEngine(tiny_llama(tokenizer, seed=0), tokenizer)
    worker = RolloutWorker(engine, tokenizer, RolloutConfig(max_turns=2, max_new_tokens=3, temperature=1.0))
    try:
        # the tiny random model says anything; the action wrapper makes it "up", so the rewards are known
        always_up = functools.partial(gym.wrappers.TransformAction, func=lambda a: "up", action_space=None)
        wrapped = await worker.run_episode(
            lambda: envhub.make("WrapShaped-v0", wrappers=[always_up]), "WrapShaped-v0", seed=0
        )
        user_wrapped = await worker.run_episode(
            lambda: TransformReward(envhub.make("WrapAsyncCounter-v0", wrappers=[always_up]), lambda r: r - 3),
            "WrapAsyncCounter-v0",
            seed=0,
        )
    finally:
        await engine.close()
    assert [t["reward"] for t in wrapped.turn_log if t["kind"] == "turn"] == [10.5, 10.5]
    assert [t["reward"] for t in user_wrapped.turn_log if t["kind"] == "turn"] == [-2.0, -2.0]
    assert wrapped.turn_log[0]["observation"] == "COUNT 0"


async def test_eval_scores_the_wrapped_env(tmp_path):
    from envhub.agents.base import Agent
    from envhub.eval import evaluate

    class SayUp(Agent):
        async def act(self, observation, info):
            return "up"

    ids = ["WrapShaped-v0", "WrapLimited-v0", "WrapAsyncCounter-v0"]
    summary = await evaluate(ids, SayUp, episodes=1, out_dir=tmp_path)
    # 3 ups: 10.5 each through the spec's TransformReward and Bonus; the spec's TimeLimit cuts WrapLimited at 2
    assert [summary[env_id]["mean_reward"] for env_id in ids] == [31.5, 2.0, 3.0]


@pytest.mark.parametrize("env_id", ["WrapShaped-v0", "WrapLimited-v0"])
def test_the_env_server_serves_the_wrapped_env(env_server, env_id):
    remote, local = RemoteEnv(env_server.url, env_id), envhub.make(env_id)
    try:
        assert play_sync(remote, ["up", "up"]) == play_sync(local, ["up", "up"])
    finally:
        remote.close()
        local.close()
