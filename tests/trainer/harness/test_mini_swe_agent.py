"""The built-in `mini-swe-agent` harness: mini-swe-agent 2.4 from PyPI, unmodified (its agent, its LiteLLM model, its
own config), in a real sandbox through the real gateway and embedded engine, on a bundled SWE-v0 task. Its bash tool
reaches the task's sandbox as the env's `bash` tool over MCP; the patch it leaves is graded by the task's hidden
tests when it exits.

The tiny model is first run once to record the exact prompt mini-swe-agent sends (its templates, its tool, the
gateway's rendering), then taught to answer that prompt with the fix as one bash call that also submits."""

from __future__ import annotations

import pytest

from envhub.errors import HarnessError
from envhub.sandboxes.testing import unavailable
from tests.trainer.gateway.conftest import teach
from tests.trainer.harness.conftest import running_gateway

pytest.importorskip("torch")

INSTANCE = "cfgkit__tomlette-3"  # its fix: `lineno = index` -> `lineno = index + 1` in tomlette/parser.py
FIX = "sed -i 's/= index$/= index + 1/' tomlette/parser.py && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "' + FIX + '"}}\n</tool_call>'


@pytest.mark.slow
async def test_mini_swe_agent_fixes_a_swe_task_through_the_envs_bash_tool(tokenizer, base_rootfs):
    from envhub.trainer.gateway.render import ChatRenderer
    from envhub.trainer.harness import HarnessEnv
    from envhub.trainer.harness.builtin import BUILTIN
    from envhub.trainer.models import tiny_llama

    try:
        BUILTIN["mini-swe-agent"].check()
    except HarnessError as exc:
        unavailable(str(exc))  # a failure where `make test` runs, a skip elsewhere
    model = tiny_llama(tokenizer, seed=0, hidden_size=128)  # room for a least-squares fit of a 60-token answer
    kwargs = {"instance_ids": [INSTANCE], "backend": "bwrap", "image": base_rootfs}
    async with running_gateway(model, tokenizer, temperature=0.0, max_tokens_per_request=96) as gateway:

        def harness(turns: int) -> HarnessEnv:
            extra = {"ENVHUB_MAX_TURNS": str(turns)}
            return HarnessEnv("SWE-v0", "mini-swe-agent", gateway, wall_clock_s=120, env_kwargs=kwargs, extra_env=extra)

        untaught = await harness(1).play(seed=0)
        assert untaught.error is None, untaught.error
        assert untaught.reward == 0.0 and len(untaught.calls) == 1  # its step limit; the unchanged repo fails
        assert "LimitsExceeded" in untaught.stderr_tail
        [first] = untaught.calls
        assert first.route == "chat.completions"
        assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in tokenizer.decode(first.prompt_ids)  # its own template

        renderer = ChatRenderer(tokenizer)
        answer = renderer.encode(CALL) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        teach(model, [first.prompt_ids], answer)
        episode = await harness(4).play(seed=0)
    assert episode.error is None, (episode.error, episode.stderr_tail)
    [call] = episode.calls
    assert call.prompt_ids == first.prompt_ids and call.output_ids == answer  # the same prompt, the taught fix
    assert call.message["tool_calls"][0]["function"]["name"] == "bash"
    assert episode.reward == 1.0, episode.info  # the sed ran in the task's sandbox; the hidden tests pass
    assert "Submitted" in episode.stderr_tail
    [trajectory] = episode.samples.trajectories
    assert trajectory.input_ids == call.prompt_ids + call.output_ids  # token for token what the engine produced
    sampled = [lp for lp, m in zip(trajectory.behavior_logprobs, trajectory.loss_mask) if m]
    assert sampled == call.logprobs and sum(trajectory.loss_mask) == len(answer)


@pytest.mark.slow
async def test_on_an_env_without_tools_its_commands_run_in_its_own_sandbox_and_the_submission_is_the_action(
    tokenizer, base_rootfs
):
    """mini-swe-agent's LocalEnvironment runs the command in the harness's sandbox; what it submits is printed as
    the env's action. Untaught it never submits and prints nothing (LiteLLM's own prints go to stderr): an error."""
    from envhub.trainer.gateway.render import ChatRenderer
    from envhub.trainer.harness import HarnessEnv
    from envhub.trainer.harness.builtin import BUILTIN
    from envhub.trainer.models import tiny_llama
    from tests.trainer.harness.conftest import AddEnv

    try:
        BUILTIN["mini-swe-agent"].check()
    except HarnessError as exc:
        unavailable(str(exc))
    env = AddEnv()
    env.reset(seed=0)
    model = tiny_llama(tokenizer, seed=0, hidden_size=128)
    async with running_gateway(model, tokenizer, temperature=0.0, max_tokens_per_request=48) as gateway:

        def harness(turns: int) -> HarnessEnv:
            return HarnessEnv(
                AddEnv, "mini-swe-agent", gateway, wall_clock_s=120, extra_env={"ENVHUB_MAX_TURNS": str(turns)}
            )

        untaught = await harness(1).play(seed=0)
        assert "printed nothing" in untaught.error and len(untaught.calls) == 1
        command = f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && expr {env.a} + {env.b}"
        call = '<tool_call>\n{"name": "bash", "arguments": {"command": "' + command + '"}}\n</tool_call>'
        answer = ChatRenderer(tokenizer).encode(call) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        teach(model, [untaught.calls[0].prompt_ids], answer)
        episode = await harness(2).play(seed=0)
    assert episode.error is None, (episode.error, episode.stderr_tail)
    assert episode.action == str(env.a + env.b) and episode.reward == 1.0 and len(episode.calls) == 1
