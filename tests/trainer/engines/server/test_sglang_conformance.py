"""serve-engine against SGLang 0.5.23's own models: requests built and responses validated with them.

SGLang's pure-Python package (installed with --no-deps in the dev extra) holds the schema of /generate
(`sglang.api.v1.api_types`), its sampling checks (`sglang.srt.sampling.sampling_params`) and its OpenAI
models (`sglang.srt.entrypoints.openai.protocol`); `tests/sglang_support.py` mounts it without its GPU runtime
(and loads the control-route structs of `io_struct.py`, its unpickler and its process-group code verbatim).
With ENVHUB_SGLANG_URL set, the tests that need no serve-engine internals run against that server.
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
import pytest

from envhub.inference import SamplingParams
from envhub.trainer.engines.server.app import start_engine_server
from envhub.trainer.engines.sglang.client import SGLangEngine
from tests.sglang_support import sglang_module

REMOTE = os.environ.get("ENVHUB_SGLANG_URL")


@pytest.fixture
def api():
    return sglang_module("sglang.api.v1.api_types")


@pytest.fixture
async def url(engine, tmp_path):
    if REMOTE:
        yield REMOTE.rstrip("/")
        return
    server = await start_engine_server(engine, weights_dirs=[tmp_path], model_path="tiny")
    yield server.url
    await server.stop()


async def post(url, path, body):
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, json=body) as response:
            return response.status, (
                await response.json() if response.content_type == "application/json" else await response.text()
            )


async def test_generate_request_and_response_follow_sglangs_schema(api, url):
    request = api.GenerateRequest(
        input_ids=[1, 2, 3],
        sampling_params=api.SamplingParams(max_new_tokens=5, temperature=0.0),
        return_logprob=True,
        rid="conf-1",
    )
    status, body = await post(url, "/generate", request.to_json_value())
    assert status == 200
    response = api.GenerateResponse.from_json_value(body)
    meta = response.meta_info
    assert meta.id == "conf-1" and meta.completion_tokens == 5 and len(meta.output_token_logprobs) == 5
    assert isinstance(meta.finish_reason, api.FinishLength) and meta.finish_reason.length == 5
    assert isinstance(meta.weight_version, str)
    assert [(s.version, s.start, s.end) for s in meta.weight_versions] == [(meta.weight_version, 0, 5)]


BAD_BODIES = [
    {"input_ids": [1], "sampling_params": {"temperature": -1}},
    {"input_ids": [1], "sampling_params": {"top_p": 0}},
    {"input_ids": [1], "sampling_params": {"top_p": 1.5}},
    {"input_ids": [1], "sampling_params": {"top_k": 0}},
    {"input_ids": [1], "sampling_params": {"min_p": 2}},
    {"input_ids": [1], "sampling_params": {"repetition_penalty": 0}},
    {"input_ids": [1], "sampling_params": {"frequency_penalty": 3}},
    {"input_ids": [1], "sampling_params": {"max_new_tokens": -1}},
    {"input_ids": [1], "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 3}},
    {"input_ids": [1], "sampling_params": {"max_new_tokens": "x"}},
    {"input_ids": [1], "sampling_params": {"not_a_param": 1}},
    {"input_ids": [1], "text": "both"},
    {},
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=[json.dumps(b)[:60] for b in BAD_BODIES])
async def test_bodies_sglang_refuses_get_400(api, url, body):
    """SGLang's own checks refuse each body (schema or SamplingParams.verify); so must the server, with 400."""
    sampling_module = sglang_module("sglang.srt.sampling.sampling_params")
    refused = False
    try:
        request = api.GenerateRequest.from_json_value(body)
        if (request.text is None) == (request.input_ids is None):
            refused = True
        else:
            sampling_module.SamplingParams(**(body.get("sampling_params") or {})).verify(vocab_size=1000)
    except (ValueError, TypeError):
        refused = True
    assert refused, "the oracle accepts this body; it does not belong in BAD_BODIES"
    status, reply = await post(url, "/generate", body)
    assert status == 400 and reply["error"]["message"]


async def test_stream_is_sse_of_cumulative_sglang_responses(api, url):
    body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        "stream": True,
        "return_logprob": True,
    }
    events = []
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/generate", json=body) as response:
            assert response.status == 200 and response.content_type == "text/event-stream"
            async for line in response.content:
                if line.strip():
                    assert line.startswith(b"data: ")
                    events.append(line[6:].strip())
    assert events[-1] == b"[DONE]"
    chunks = [api.GenerateResponse.from_json_value(json.loads(e)) for e in events[:-1]]
    lengths = [len(c.output_ids) for c in chunks]
    assert lengths == sorted(lengths) and lengths[-1] == 4  # cumulative, as SGLang's default streaming
    if not REMOTE:
        assert lengths == [1, 2, 3, 4, 4]  # serve-engine sends every token
    assert isinstance(chunks[-1].meta_info.finish_reason, api.FinishLength)


async def test_model_info_fields_and_string_versions(api, url):
    async with aiohttp.ClientSession() as http:
        for path in ("/model_info", "/get_model_info"):
            async with http.get(url + path) as response:
                info = api.GetModelInfoResponse.from_json_value(await response.json())
                assert info.is_generation and isinstance(info.weight_version, str)
        async with http.get(url + "/get_weight_version") as response:
            assert response.status == 404  # not an SGLang route


async def test_update_without_weight_version_keeps_the_string(url, tokenizer, tmp_path):
    from envhub.trainer.models import tiny_llama

    if REMOTE:
        pytest.skip("writes weights the remote server cannot read")
    tiny_llama(tokenizer, seed=1).save_pretrained(tmp_path / "w")
    status, reply = await post(url, "/update_weights_from_disk", {"model_path": str(tmp_path / "w")})
    assert status == 200 and reply["success"]
    status, reply = await post(
        url, "/update_weights_from_disk", {"model_path": str(tmp_path / "w"), "weight_version": "step_5"}
    )
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/model_info") as response:
            info = await response.json()
    assert info["weight_version"] == "step_5" and info["model_path"] == str(tmp_path / "w")
    status, reply = await post(
        url, "/update_weights_from_disk", {"model_path": str(tmp_path / "w"), "weight_version": 6}
    )
    assert status == 400


async def test_abort_reaches_live_rids_by_prefix_as_sglang(url, engine):
    """SGLang's tokenizer manager drops an abort whose exact rid is not live; its scheduler matches by prefix."""
    if REMOTE:
        pytest.skip("needs the server's state")
    sampling = {"max_new_tokens": 400, "temperature": 0}
    tasks = {
        rid: asyncio.create_task(post(url, "/generate", {"input_ids": [3, 4], "sampling_params": sampling, "rid": rid}))
        for rid in ("job-1", "job-10", "job-1/r1", "job-2", "job-3/r1")
    }
    while engine.num_running < 5:
        await asyncio.sleep(0.01)
    assert (await post(url, "/abort_request", {"rid": "job-1"}))[0] == 200
    assert (await post(url, "/abort_request", {"rid": "job-3"}))[0] == 200  # not live: dropped
    done = {rid: (await asyncio.wait_for(tasks[rid], 60))[1] for rid in ("job-1", "job-10", "job-1/r1")}
    assert {rid: r["meta_info"]["finish_reason"]["type"] for rid, r in done.items()} == dict.fromkeys(done, "abort")
    assert not tasks["job-2"].done() and not tasks["job-3/r1"].done()
    await post(url, "/abort_request", {"abort_all": True})
    for rid in ("job-2", "job-3/r1"):
        assert (await tasks[rid])[1]["meta_info"]["finish_reason"]["type"] == "abort"


async def test_openai_client_chat_with_tools_completions_and_models(url):
    openai = pytest.importorskip("openai")
    protocol = sglang_module("sglang.srt.entrypoints.openai.protocol")
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    models = await client.models.list()
    name = models.data[0].id
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "run",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        }
    ]
    request = protocol.ChatCompletionRequest(
        model=name, messages=[{"role": "user", "content": "hi"}], tools=tools, max_tokens=6, temperature=0
    )
    chat = await client.chat.completions.create(
        **request.model_dump(include={"model", "messages", "tools", "max_tokens", "temperature"}, exclude_none=True)
    )
    assert chat.choices[0].finish_reason in ("stop", "length", "tool_calls") and chat.usage.completion_tokens <= 6
    protocol.ChatCompletionResponse.model_validate(chat.model_dump())
    completion = await client.completions.create(model=name, prompt="Hello", max_tokens=3, temperature=0, n=2)
    assert len(completion.choices) == 2 and completion.usage.completion_tokens == 6
    protocol.CompletionResponse.model_validate(completion.model_dump())
    stream = await client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    pieces = [chunk async for chunk in stream]
    assert pieces[-1].choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=name, messages=[], max_tokens=3)
    await client.close()


async def test_api_key_as_sglang(engine, tmp_path):
    server = await start_engine_server(engine, api_key="s3cret", weights_dirs=[tmp_path])
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(server.url + "/health") as response:
                assert response.status == 200  # probes stay open, as SGLang
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "s3cret"},
                {"Authorization": "Basic s3cret"},
            ):
                async with http.get(server.url + "/model_info", headers=headers) as response:
                    assert response.status == 401
        client = SGLangEngine(server.url, api_key="s3cret")
        assert (await client.generate([1, 2], SamplingParams(max_new_tokens=2))).output_ids
        await client.close()
    finally:
        await server.stop()


async def test_non_loopback_bind_without_key_refused(engine):
    from envhub.errors import EngineError

    with pytest.raises(EngineError, match="without an API key"):
        await start_engine_server(engine, host="0.0.0.0")
