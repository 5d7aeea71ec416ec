"""A harness's chat episode through the gateway, with the `openai` client: recorded token for token, merged when the
history is appended to, split into samples (sharing the episode's advantage) when the harness rewrites it."""

from __future__ import annotations

import json

import pytest

from envhub.inference import SamplingParams
from envhub.trainer.gateway import sample_advantages, to_trajectories
from tests.trainer.gateway.conftest import CHAT_TOOLS, FIRST_MESSAGES


async def two_calls(gateway, client, rewrite: bool):
    """Call 1 answers with a tool call; the harness runs it and sends the result (streamed call 2)."""
    first = await client.chat.completions.create(
        model="policy", messages=FIRST_MESSAGES, tools=CHAT_TOOLS, max_tokens=40, temperature=0, logprobs=True
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    echoed = choice.message.model_dump(exclude_none=True)
    if rewrite:  # a harness that summarises its history: the assistant turn comes back as prose
        echoed = {"role": "assistant", "content": "I called add(2, 3)."}
    history = [*FIRST_MESSAGES, echoed, {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    stream = await client.chat.completions.create(
        model="policy", messages=history, tools=CHAT_TOOLS, max_tokens=6, temperature=0, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
    return first, chunks


async def test_appending_harness_merges_into_one_trajectory_matching_the_engine(gateway, client_for):
    handle = gateway.open_episode()
    first, _ = await two_calls(gateway, client_for(handle), rewrite=False)
    calls = gateway.close_episode(handle)
    assert [c.echoed for c in calls] == [0, 1] and [c.reencoded for c in calls] == [0, 0]
    samples = to_trajectories(calls, 1.0, task="add", group_id="g")
    assert samples.merged and len(samples.trajectories) == 1
    traj = samples.trajectories[0]
    assert traj.input_ids == calls[1].prompt_ids + calls[1].output_ids
    model_ids = [t for t, m in zip(traj.input_ids, traj.loss_mask) if m]
    assert model_ids == calls[0].output_ids + calls[1].output_ids
    sent = [c.logprob for c in first.choices[0].logprobs.content]  # what the client saw for call 1
    assert [lp for lp, m in zip(traj.behavior_logprobs, traj.loss_mask) if m][: len(sent)] == sent
    assert [(s.start, s.end) for s in traj.turn_spans] == [
        (len(calls[0].prompt_ids), len(calls[0].prompt_ids) + len(calls[0].output_ids)),
        (len(calls[1].prompt_ids), len(traj.input_ids)),
    ]
    assert [s.reward for s in traj.turn_spans] == [0.0, 1.0]
    assert set(traj.versions[i] for i, m in enumerate(traj.loss_mask) if m) == {gateway.engine.version}
    for call in calls:  # the engine, asked again with the recorded prompt, samples the recorded tokens
        again = await gateway.engine.generate(
            call.prompt_ids,
            SamplingParams(max_new_tokens=len(call.output_ids), temperature=0, stop_token_ids=(2,)),
        )
        assert again.output_ids == call.output_ids
        assert again.logprobs == pytest.approx(call.logprobs, abs=1e-4)


async def test_rewriting_harness_yields_samples_sharing_the_episode_advantage(gateway, client_for):
    rewritten = gateway.open_episode()
    await two_calls(gateway, client_for(rewritten), rewrite=True)
    calls = gateway.close_episode(rewritten)
    assert [c.echoed for c in calls] == [0, 0] and calls[1].reencoded == 1
    split = to_trajectories(calls, 1.0, task="add", group_id="g")
    assert not split.merged and len(split.trajectories) == 2
    for call, traj in zip(calls, split.trajectories):
        assert traj.input_ids == call.prompt_ids + call.output_ids and traj.reward == 1.0
        assert traj.loss_mask == [0] * len(call.prompt_ids) + [1] * len(call.output_ids)
    failed = gateway.open_episode()
    await client_for(failed).chat.completions.create(
        model="policy", messages=FIRST_MESSAGES, max_tokens=3, temperature=0
    )
    other = to_trajectories(gateway.close_episode(failed), 0.0, task="add", group_id="g")
    advantages = sample_advantages([split, other])
    assert advantages == [[pytest.approx(1.0, abs=1e-5)] * 2, [pytest.approx(-1.0, abs=1e-5)]]
