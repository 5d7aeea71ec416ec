"""ShellQuiz-v0: a question about a generated file, answered with bash in a real Docker sandbox."""

import json

import pytest

from envhub.agents import ExpertAgent
from envhub.envs.shell_quiz import ShellQuizEnv
from envhub.errors import ConfigError


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def test_expert_solves_every_seed_by_running_the_command_in_the_sandbox(docker_pool):
    env = ShellQuizEnv(pool=docker_pool)
    agent = ExpertAgent()
    agent.bind_env(env)
    try:
        for seed in range(4):
            obs, info = await env.areset(seed=seed)
            agent.reset(info)
            assert "notes.txt" in obs and [t["function"]["name"] for t in info["tools"]] == ["bash", "submit"]
            obs, reward, terminated, _, _ = await env.astep(await agent.act(obs, info))
            assert obs.split("\n")[0].strip() == str(env.answer) and not terminated  # real bash output
            obs, reward, terminated, _, _ = await env.astep(await agent.act(obs, info))
            assert (reward, terminated, obs) == (1.0, True, "Correct.")
    finally:
        await env.aclose()


async def test_envhub_collect_records_the_experts_tool_calls(docker_pool, tmp_path):
    from envhub.toolcalls import parse_tool_calls
    from envhub.trainer.collect import collect

    demos = await collect("ShellQuiz-v0", 2, tmp_path / "quiz.jsonl", env_kwargs={"pool": docker_pool})
    assert [d.reward for d in demos] == [1.0, 1.0] and len((tmp_path / "quiz.jsonl").read_text().splitlines()) == 2
    bash_turn, submit_turn = demos[0].messages[2]["content"], demos[0].messages[4]["content"]
    assert bash_turn.startswith('<tool_call>{"name": "bash", "arguments": {"command": ') and bash_turn.endswith(
        "}}</tool_call>"
    )
    assert parse_tool_calls(submit_turn).calls[0].name == "submit"
    assert [t["function"]["name"] for t in demos[0].tools] == ["bash", "submit"]


async def test_wrong_answers_prose_and_step_limit(docker_pool):
    env = ShellQuizEnv(pool=docker_pool, max_steps=2)
    try:
        await env.areset(seed=3)
        obs, reward, terminated, truncated, _ = await env.astep("I think it is five")
        assert "No tool call found" in obs and reward == 0.0 and not (terminated or truncated)
        obs, reward, terminated, truncated, _ = await env.astep(call("bash", command="cat notes.txt"))
        assert truncated and reward == 0.0 and len(obs.splitlines()) >= 4
        await env.areset(seed=3)
        obs, reward, terminated, _, _ = await env.astep(call("submit", answer=str(env.answer + 1)))
        assert terminated and reward == 0.0 and obs == f"Wrong: the answer was {env.answer}."
    finally:
        await env.aclose()


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown sandbox backend"):
        ShellQuizEnv(backend="vm")


async def test_anchor_names_the_task_until_a_command_runs(docker_pool):
    env = ShellQuizEnv(pool=docker_pool)
    try:
        _, info = await env.areset(seed=3)
        start = info["anchor"]
        assert start.startswith("task=")
        *_, info = await env.astep("Let me think first.")  # no command ran: the sandbox is as setup left it
        assert info["anchor"] == start
        *_, info = await env.astep(call("bash", command="cat notes.txt"))
        assert "anchor" not in info  # the filesystem may have changed: the trainer hashes the observation
        _, info = await env.areset(seed=3)
        assert info["anchor"] == start
        _, info = await env.areset(seed=4)
        assert info["anchor"] != start  # another file or question
    finally:
        await env.aclose()
