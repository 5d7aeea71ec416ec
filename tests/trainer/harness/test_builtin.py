"""The built-in `openai-agents` harness: the OpenAI Agents SDK from PyPI, unmodified, in a real sandbox through the
real gateway and embedded engine; its trajectory is checked token for token against what the engine generated."""

from __future__ import annotations

import pytest

from envhub.errors import HarnessError
from envhub.sandboxes.testing import unavailable
from tests.trainer.gateway.conftest import teach
from tests.trainer.harness.conftest import AddEnv

pytest.importorskip("torch")


@pytest.fixture
async def agents_gateway(tokenizer):
    """A gateway whose tiny model is taught to answer the SDK's first prompt for AddEnv(seed=0) with the sum."""
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.gateway import Gateway, GatewayConfig
    from envhub.trainer.gateway.render import ChatRenderer
    from envhub.trainer.harness.builtin import BUILTIN
    from envhub.trainer.harness.env import task_text
    from envhub.trainer.models import tiny_llama

    env = AddEnv()
    obs, _ = env.reset(seed=0)
    messages = [
        {"role": "system", "content": BUILTIN["openai-agents"].env["ENVHUB_INSTRUCTIONS"]},
        {"role": "user", "content": task_text(env.system_prompt, obs)},
    ]
    renderer = ChatRenderer(tokenizer)
    model = tiny_llama(tokenizer, seed=0)
    answer = renderer.encode(str(env.a + env.b)) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    teach(model, [renderer.prompt(messages, None, None).ids], answer)
    engine = EmbeddedEngine(model, tokenizer)
    gateway = Gateway(engine, tokenizer, GatewayConfig(temperature=0.0, max_tokens_per_request=16))
    await gateway.start()
    yield gateway
    await gateway.stop()
    await engine.close()


async def test_the_agents_sdk_solves_the_task_in_a_sandbox(agents_gateway, base_rootfs):
    from envhub.trainer.harness import HarnessEnv
    from envhub.trainer.harness.builtin import BUILTIN

    try:
        BUILTIN["openai-agents"].check()
    except HarnessError as exc:
        unavailable(str(exc))  # a failure where `make test` runs, a skip elsewhere
    episode = await HarnessEnv(AddEnv, "openai-agents", agents_gateway, wall_clock_s=60).play(seed=0)
    assert episode.error is None, episode.error
    assert episode.reward == 1.0 and episode.action == str(episode.info["answer"])
    [call] = episode.calls
    assert call.route == "responses"
    [trajectory] = episode.samples.trajectories
    assert trajectory.input_ids == call.prompt_ids + call.output_ids  # token for token what the engine produced
    assert [lp for lp, m in zip(trajectory.behavior_logprobs, trajectory.loss_mask) if m] == call.logprobs


def test_a_missing_harness_package_names_the_fix(monkeypatch, tmp_path):
    from envhub.trainer.harness import builtin

    monkeypatch.setattr(builtin, "overlay_dir", lambda: tmp_path)
    with pytest.raises(HarnessError, match="make install"):
        builtin.resolve("openai-agents", sandboxed=True)
