"""The built-in `openai-agents` harness: the OpenAI Agents SDK from PyPI, unmodified, in a real sandbox through the
real gateway and embedded engine, on a tool env whose tool it reaches over MCP; its trajectory is checked token for
token against what the engine generated."""

from __future__ import annotations

import json

import pytest

from envhub.errors import HarnessError
from envhub.sandboxes.testing import unavailable
from tests.trainer.gateway.conftest import teach
from tests.trainer.harness.conftest import ANSWER_TOOL, AddToolEnv, running_gateway

pytest.importorskip("torch")


@pytest.fixture
async def agents_gateway(tokenizer):
    """A gateway whose tiny model is taught to answer the SDK's first prompt for AddToolEnv(seed=0) with a call of
    the env's answer tool carrying the sum (the tool reaches the SDK over MCP; the gateway renders it as text)."""
    from envhub.trainer.gateway.render import ChatRenderer
    from envhub.trainer.harness.builtin import BUILTIN
    from envhub.trainer.harness.env import task_text
    from envhub.trainer.models import tiny_llama

    env = AddToolEnv()
    obs, _ = env.reset(seed=0)
    messages = [
        {"role": "system", "content": BUILTIN["openai-agents"].env["ENVHUB_INSTRUCTIONS"]},
        {"role": "user", "content": task_text(env.system_prompt, obs)},
    ]
    renderer = ChatRenderer(tokenizer)
    model = tiny_llama(tokenizer, seed=0)
    arguments = json.dumps({"value": env.a + env.b})
    call = f'<tool_call>\n{{"name": "answer", "arguments": {arguments}}}\n</tool_call>'
    answer = renderer.encode(call) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    teach(model, [renderer.prompt(messages, [ANSWER_TOOL], None).ids], answer)
    async with running_gateway(model, tokenizer, temperature=0.0, max_tokens_per_request=48) as gateway:
        yield gateway


async def test_the_agents_sdk_solves_a_tool_task_over_mcp_in_a_sandbox(agents_gateway, base_rootfs):
    from envhub.trainer.harness import HarnessEnv
    from envhub.trainer.harness.builtin import BUILTIN

    try:
        BUILTIN["openai-agents"].check()
    except HarnessError as exc:
        unavailable(str(exc))  # a failure where `make test` runs, a skip elsewhere
    episode = await HarnessEnv(AddToolEnv, "openai-agents", agents_gateway, wall_clock_s=60).play(seed=0)
    assert episode.error is None, episode.error
    assert episode.reward == 1.0  # the SDK called the env's tool over MCP with the sum
    first, second = episode.calls  # the tool call, then the SDK's answer after the tool's result
    assert first.route == second.route == "responses" and first.message["content"] is None
    assert episode.merged and second.echoed == 1  # the SDK sent the gateway's function_call back as it came
    [trajectory] = episode.samples.trajectories
    assert trajectory.input_ids == second.prompt_ids + second.output_ids  # token for token what the engine produced
    sampled = [lp for lp, m in zip(trajectory.behavior_logprobs, trajectory.loss_mask) if m]
    assert sampled == first.logprobs + second.logprobs


def test_a_missing_harness_package_names_the_fix(monkeypatch, tmp_path):
    from envhub.trainer.harness import builtin

    monkeypatch.setattr(builtin, "overlay_dir", lambda: tmp_path)
    with pytest.raises(HarnessError, match="make install"):
        builtin.resolve("openai-agents", sandboxed=True)
