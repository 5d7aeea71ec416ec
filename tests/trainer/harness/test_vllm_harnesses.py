"""Both built-in harnesses, unmodified, with their model calls served by a real vLLM server (the suite's, CPU build,
the tiny random Llama) through the gateway: every call is recorded with the ids and logprobs vLLM returned, and the
episode's trajectory is those ids token for token. The untaught model's replies are noise, so the rewards are 0;
what is checked is the path: program -> sandbox -> gateway -> vLLM -> trajectory."""

from __future__ import annotations

import pytest

from envhub.errors import HarnessError
from envhub.sandboxes.testing import unavailable
from tests.trainer.harness.conftest import AddToolEnv
from tests.vllm_support import TINY_KEY

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]


@pytest.fixture
async def vllm_gateway(vllm_url, tokenizer):
    """A gateway over the suite's vLLM server, its engine recording what each generate call returned."""
    from envhub.trainer.engines.vllm.engine import VLLMEngine
    from envhub.trainer.gateway import Gateway, GatewayConfig

    class Recording(VLLMEngine):
        async def generate(self, input_ids, sampling, **kwargs):
            result = await super().generate(input_ids, sampling, **kwargs)
            self.returned.append((list(input_ids), result))
            return result

    engine = Recording(vllm_url, api_key=TINY_KEY)
    engine.returned = []
    gateway = Gateway(engine, tokenizer, GatewayConfig(max_tokens_per_request=24, temperature=1.0))
    await gateway.start()
    try:
        yield gateway, engine.returned
    finally:
        await gateway.stop()
        await engine.close()


def check_recorded(episode, returned, error: bool = False) -> None:
    """Each recorded call is one generate call of vLLM's, ids and logprobs as it returned them; the trajectories
    hold exactly those ids, the sampled ones (and only those) trained."""
    assert error or episode.error is None, (episode.error, episode.stderr_tail)
    assert len(episode.calls) == len(returned) >= 1
    for call, (prompt, result) in zip(episode.calls, returned):
        assert call.prompt_ids == prompt and call.output_ids == list(result.output_ids)
        assert call.logprobs == list(result.logprobs)
    trajectories, calls = episode.samples.trajectories, episode.calls
    if episode.merged:  # one trajectory: the last prompt extends every earlier call, token for token
        [trajectory] = trajectories
        assert trajectory.input_ids == calls[-1].prompt_ids + calls[-1].output_ids
        sampled = [i for i, m in zip(trajectory.input_ids, trajectory.loss_mask) if m]
        assert sampled == [i for call in calls for i in call.output_ids]
    else:  # one sample per call
        assert [t.input_ids for t in trajectories] == [c.prompt_ids + c.output_ids for c in calls]
        for trajectory, call in zip(trajectories, calls):
            assert [i for i, m in zip(trajectory.input_ids, trajectory.loss_mask) if m] == call.output_ids


def require(name: str) -> None:
    from envhub.trainer.harness.builtin import BUILTIN

    try:
        BUILTIN[name].check()
    except HarnessError as exc:
        unavailable(str(exc))  # a failure where `make test` runs, a skip elsewhere


async def test_the_agents_sdk_through_vllm(vllm_gateway):
    from envhub.trainer.config import TaskConfig
    from envhub.trainer.harness import HarnessEnv
    from envhub.trainer.rollout.harness_rollouts import scored_zero

    require("openai-agents")
    gateway, returned = vllm_gateway
    episode = await HarnessEnv(AddToolEnv, "openai-agents", gateway, wall_clock_s=120).play(seed=0)
    # the untaught model never ends a reply, and the SDK ends its run on a reply cut at max_tokens: the episode is
    # the policy's failure, trained as reward 0 under `harness_errors: zero` (configs/harness-smollm2.yaml)
    assert "max_output_tokens" in episode.error and episode.calls
    check_recorded(scored_zero(episode, TaskConfig(env="AddToolEnv"), 0, "g"), returned, error=True)
    assert episode.calls[0].route == "responses" and len(episode.calls[0].output_ids) == 24  # the gateway's cap


async def test_mini_swe_agent_through_vllm_on_a_swe_task(vllm_gateway, base_rootfs):
    from envhub.trainer.harness import HarnessEnv

    require("mini-swe-agent")
    gateway, returned = vllm_gateway
    kwargs = {"instance_ids": ["cfgkit__tomlette-3"], "backend": "bwrap", "image": base_rootfs}
    extra = {"ENVHUB_MAX_TURNS": "2"}
    harness = HarnessEnv("SWE-v0", "mini-swe-agent", gateway, wall_clock_s=120, env_kwargs=kwargs, extra_env=extra)
    episode = await harness.play(seed=0)
    print("merged", episode.merged, [(c.echoed, c.reencoded) for c in episode.calls])
    check_recorded(episode, returned)
    assert episode.reward == 0.0 and episode.calls[0].route == "chat.completions"
    assert episode.info["resolved"] is False  # submitted when it exited and graded: the unchanged repo fails
