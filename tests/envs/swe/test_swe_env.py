"""SWE-v0 end to end on Docker sandboxes: a scripted agent fixes a bug, hostile agents get 0 with a reason."""

import asyncio
import json

import gymnasium as gym
import pytest

import envhub
from envhub.envs.swe import SWEEnv

TASK = "calcworks__exprcalc-3"  # user variables must shadow the built-in constants


def tool_call(name, **arguments):
    """An action the way a Hermes/Qwen model writes it."""
    return f"Let me do that.\n<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
async def env(docker_pool):
    env = SWEEnv(pool=docker_pool, max_steps=12, command_timeout=5)
    yield env
    await env.aclose()


async def test_scripted_agent_solves_a_task_through_the_tools(env):
    obs, info = await env.areset(options={"instance_id": TASK})
    assert "variable named `e`" in obs and {t["function"]["name"] for t in info["tools"]} == {
        "bash",
        "view",
        "str_replace_edit",
        "submit",
    }
    listing, *_ = await env.astep(tool_call("view", path="exprcalc"))
    assert "evaluator.py" in listing
    source, *_ = await env.astep(tool_call("view", path="exprcalc/evaluator.py"))
    assert "**CONSTANTS" in source
    repro, *_ = await env.astep(
        tool_call("bash", command="python3 -c 'from exprcalc import evaluate; print(evaluate(\"e * 2\", {\"e\": 10}))'")
    )
    assert "5.43" in repro
    edited, *_ = await env.astep(
        tool_call(
            "str_replace_edit",
            path="exprcalc/evaluator.py",
            old_str="names = {**(variables or {}), **CONSTANTS}",
            new_str="names = {**CONSTANTS, **(variables or {})}",
        )
    )
    assert "edited" in edited
    tests, reward, terminated, _, _ = await env.astep(tool_call("bash", command="python3 -m pytest -q 2>&1 | tail -1"))
    assert "passed" in tests and reward == 0.0 and not terminated
    obs, reward, terminated, truncated, info = await env.astep(tool_call("submit"))
    assert (reward, terminated, truncated) == (1.0, True, False), info["reason"]
    assert info["resolved"] and "exprcalc/evaluator.py" in info["diff"]
    assert all(outcome == "PASSED" for outcome in info["tests"].values()) and len(info["tests"]) >= 10


async def test_hostile_agent_gets_zero_with_a_reason_and_nothing_crashes(env):
    await env.areset(options={"instance_id": TASK})
    huge, *_ = await env.astep(tool_call("bash", command="yes 'spam spam spam' | head -c 50000000"))
    assert len(huge) < 20_000 and "truncated" in huge
    loop, *_ = await env.astep(tool_call("bash", command="while true; do :; done"))
    assert "timed out" in loop
    forkish, *_ = await env.astep(tool_call("bash", command="sleep 1000 & sleep 1000 & echo started"))
    assert "started" in forkish
    binary, *_ = await env.astep(
        tool_call(
            "bash",
            command="head -c 100000 /dev/urandom > blob.bin && printf '\\x00\\xff\\xfe' > exprcalc/evaluator.py && "
            "echo ok",
        )
    )
    assert "ok" in binary
    viewed, *_ = await env.astep(tool_call("view", path="exprcalc/evaluator.py"))
    assert "not a UTF-8 text file" in viewed
    dumped, *_ = await env.astep(tool_call("bash", command="cat blob.bin"))
    assert env.observation_space.contains(dumped)
    garbage, reward, *_ = await env.astep("<tool_call>{not json</tool_call>")
    assert "not valid JSON" in garbage and reward == 0.0
    await env.astep(tool_call("bash", command="rm -rf / 2>/dev/null; rm -rf /workspace/repo/* ; ls"))
    obs, reward, terminated, truncated, info = await env.astep(tool_call("submit"))
    assert reward == 0.0 and terminated and not info["resolved"]
    assert info["reason"] and "Not resolved" in obs


async def test_wrecked_git_repo_and_step_limit_give_zero_with_reason(docker_pool):
    env = SWEEnv(pool=docker_pool, max_steps=2, command_timeout=5)
    try:
        await env.areset(options={"instance_id": TASK})
        await env.astep(tool_call("bash", command="rm -rf .git"))
        obs, reward, terminated, truncated, info = await env.astep("I am thinking...")
        assert "No tool call found" in obs and "step limit" in obs
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert "could not read the agent's changes" in info["reason"]
        with pytest.raises(envhub.ResetNeeded):
            await env.astep(tool_call("submit"))
    finally:
        await env.aclose()


async def test_only_the_first_of_several_calls_runs(env):
    await env.areset(options={"instance_id": TASK})
    obs, *_ = await env.astep(tool_call("bash", command="echo one") + tool_call("bash", command="echo two"))
    assert "one" in obs and "two" not in obs.replace("only the first of your 2", "") and "only the first" in obs


@pytest.mark.slow
def test_check_env_and_gym_make(base_image):
    from gymnasium.utils.env_checker import check_env

    env = gym.make("envhub/SWE-v0", instance_ids=["tidewater__datewise-6"])
    try:
        check_env(env.unwrapped, skip_render_check=True)
        obs, info = env.reset(seed=3)
        assert info["instance_id"] == "tidewater__datewise-6" and "60 seconds ago" in obs
        obs, reward, terminated, truncated, info = env.step({"name": "submit", "arguments": {}})
        assert reward == 0.0 and terminated and info["diff"] == ""
    finally:
        env.close()


async def test_episodes_do_not_block_each_other(docker_pool):
    envs = [SWEEnv(pool=docker_pool, command_timeout=10) for _ in range(2)]
    try:
        await asyncio.gather(*(e.areset(options={"instance_id": TASK}) for e in envs))
        started = asyncio.get_running_loop().time()
        results = await asyncio.gather(*(e.astep(tool_call("bash", command="sleep 2; echo done")) for e in envs))
        elapsed = asyncio.get_running_loop().time() - started
        assert all("done" in r[0] for r in results)
        assert elapsed < 3.8, f"two 2-second steps took {elapsed:.1f} s: steps are blocking each other"
    finally:
        await asyncio.gather(*(e.aclose() for e in envs))
