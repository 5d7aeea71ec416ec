"""/v1/responses through the gateway with the `openai` client (the Agents SDK's default API): a function tool round
trip whose second call echoes the first call's output items, streamed, checked against `openai.types.responses`."""

from __future__ import annotations

import json

import pytest

from envhub.trainer.gateway import to_trajectories
from tests.trainer.gateway.conftest import RESPONSE_TOOLS, SYSTEM, TASK

responses_types = pytest.importorskip("openai.types.responses")


async def test_function_tool_round_trip_streams_and_merges(gateway, client_for):
    from pydantic import TypeAdapter

    handle = gateway.open_episode()
    client = client_for(handle)
    first = await client.responses.create(
        model=handle.model, instructions=SYSTEM, input=TASK, tools=RESPONSE_TOOLS, max_output_tokens=40, temperature=0
    )
    responses_types.Response.model_validate(first.model_dump())  # strict: the client itself builds leniently
    assert first.status == "completed" and first.usage.output_tokens > 0
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    history = [
        {"role": "user", "content": TASK},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
    ]
    stream = await client.responses.create(
        model=handle.model,
        instructions=SYSTEM,
        input=history,
        tools=RESPONSE_TOOLS,
        max_output_tokens=6,
        temperature=0,
        stream=True,
    )
    events = [event async for event in stream]
    adapter = TypeAdapter(responses_types.ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event.model_dump())
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.status in ("completed", "incomplete") and final.usage.output_tokens <= 6
    calls = gateway.close_episode(handle)
    assert [c.route for c in calls] == ["responses", "responses"] and calls[1].echoed == 1
    samples = to_trajectories(calls, 1.0, task="add")
    assert samples.merged and samples.trajectories[0].input_ids == calls[1].prompt_ids + calls[1].output_ids


async def test_responses_refusals(gateway, client_for):
    import openai

    client = client_for(gateway.open_episode())
    with pytest.raises(openai.BadRequestError, match="previous_response_id is not supported"):
        await client.responses.create(model="policy", input="hi", previous_response_id="resp_1", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        await client.responses.create(model="policy", input="hi", tools=[{"type": "web_search"}], max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="not supported here"):
        await client.responses.create(model="policy", input=[{"type": "image_generation_call", "id": "x"}])
