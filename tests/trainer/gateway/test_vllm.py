"""The gateway in front of a real vLLM server (the suite's shared tiny one): what the harness got is what vLLM
sampled, token for token, and an appending chat episode merges."""

from __future__ import annotations

import pytest

from envhub.inference import SamplingParams
from envhub.trainer.engines.vllm.engine import VLLMEngine
from envhub.trainer.gateway import Gateway, to_trajectories
from tests.trainer.gateway.conftest import FIRST_MESSAGES
from tests.vllm_support import TINY_KEY

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]


async def test_chat_episode_through_vllm_is_recorded_token_for_token(vllm_url, tokenizer, client_for):
    engine = VLLMEngine(vllm_url, retries=1, api_key=TINY_KEY)
    gateway = Gateway(engine, tokenizer)
    await gateway.start()
    try:
        handle = gateway.open_episode()
        client = client_for(handle)
        first = await client.chat.completions.create(
            model="policy", messages=FIRST_MESSAGES, max_tokens=8, temperature=0, logprobs=True
        )
        history = [*FIRST_MESSAGES, first.choices[0].message.model_dump(exclude_none=True)]
        history.append({"role": "user", "content": "And 3 + 4?"})
        stream = await client.chat.completions.create(
            model="policy", messages=history, max_tokens=8, temperature=0, stream=True
        )
        assert [chunk async for chunk in stream][-1].choices[0].finish_reason in ("stop", "length")
        calls = gateway.close_episode(handle)
        assert [c.echoed for c in calls] == [0, 1]
        assert [c.logprob for c in first.choices[0].logprobs.content] == calls[0].logprobs
        samples = to_trajectories(calls, 1.0, task="chat")
        assert samples.merged and samples.trajectories[0].num_model_tokens == sum(len(c.output_ids) for c in calls)
        for call in calls:  # vLLM, asked again with the recorded prompt, samples the recorded tokens
            greedy = SamplingParams(max_new_tokens=len(call.output_ids), temperature=0, stop_token_ids=(2,))
            again = await engine.generate(call.prompt_ids, greedy)
            assert again.output_ids == call.output_ids
            assert again.logprobs == pytest.approx(call.logprobs, abs=1e-4)
    finally:
        await gateway.stop()
        await engine.close()
