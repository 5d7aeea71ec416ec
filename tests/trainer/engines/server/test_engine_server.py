"""SGLangEngine against a real `serve-engine` HTTP server on 127.0.0.1 (in-process and as the CLI subprocess)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import aiohttp
import pytest

from envhub.errors import EngineError
from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.server.app import start_engine_server
from envhub.trainer.engines.sglang.client import SGLangEngine

torch = pytest.importorskip("torch")

GREEDY = SamplingParams(max_new_tokens=20, temperature=0.0)


@pytest.fixture
async def served(engine, tmp_path):
    server = await start_engine_server(engine, weights_dirs=[tmp_path])
    client = SGLangEngine(server.url, retries=1)
    yield engine, server, client
    await client.close()
    await server.stop()


async def _wait_for_tokens(engine: EmbeddedEngine, count: int) -> None:
    while engine.stats.tokens < count or engine.num_running == 0:
        await asyncio.sleep(0.005)


async def test_client_matches_local_engine(served, tiny_model, tokenizer):
    _, _, client = served
    prompts = [tokenizer.encode(t) for t in ["Hello there", "What is 7+5?", "x"]]
    direct = EmbeddedEngine(tiny_model, tokenizer)
    params = [GREEDY, SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.95, seed=5)]
    try:
        for sampling in params:
            remote = await asyncio.gather(*[client.generate(p, sampling) for p in prompts])
            local = await asyncio.gather(*[direct.generate(p, sampling) for p in prompts])
            for r, loc in zip(remote, local):
                assert r.output_ids == loc.output_ids and r.finish_reason == loc.finish_reason
                assert r.logprobs == pytest.approx(loc.logprobs, abs=1e-5)
                assert r.token_versions == [0] * len(r.output_ids)
    finally:
        await direct.close()


async def test_raw_http_subset(served, tokenizer):
    engine, server, _ = served
    async with aiohttp.ClientSession() as http:
        body = {
            "input_ids": [tokenizer.encode("a b"), tokenizer.encode("c")],
            "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        }
        async with http.post(server.url + "/generate", json=body) as response:
            batch = await response.json()
        assert [len(b["output_ids"]) for b in batch] == [3, 3] and "output_token_logprobs" not in batch[0]["meta_info"]
        assert batch[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
        async with http.post(
            server.url + "/generate",
            json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "return_logprob": True},
        ) as response:
            one = await response.json()
        assert len(one["meta_info"]["output_token_logprobs"]) == 2 and isinstance(one["text"], str)
        for bad, message in [
            ({"input_ids": []}, "empty"),
            ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
            ({"input_ids": [1], "sampling_params": {"max_new_tokens": "x"}}, "max_new_tokens"),
            ({}, "input_ids"),
            ({"input_ids": [1], "sampling_params": {"bogus": 1}}, "bogus"),
            ({"input_ids": [1], "text": "a"}, "same time"),
        ]:
            async with http.post(server.url + "/generate", json=bad) as response:
                assert response.status == 400 and message in (await response.json())["error"]["message"]
        async with http.get(server.url + "/health") as response:
            assert response.status == 200
        async with http.get(server.url + "/model_info") as response:
            assert (await response.json())["weight_version"] == "default"
        async with http.post(server.url + "/update_weights_from_disk", json={"model_path": "/nonexistent"}) as response:
            reply = await response.json()
            assert response.status == 400 and reply["success"] is False and "outside" in reply["message"]


async def test_flush_cache_refused_while_running(served, tokenizer):
    engine, _, client = served
    assert await client.flush_cache()
    long = asyncio.create_task(
        client.generate(tokenizer.encode("count"), SamplingParams(max_new_tokens=400, temperature=0))
    )
    await _wait_for_tokens(engine, 3)
    assert not await client.flush_cache()
    await client.abort()
    assert (await long).finish_reason == "abort"  # a client-side abort is not resubmitted
    assert await client.flush_cache()


async def test_weight_update_aborts_and_client_resubmits_keeping_versions(served, tokenizer, tmp_path):
    from envhub.trainer.models import tiny_llama

    engine, _, client = served
    tiny_llama(tokenizer, seed=3).save_pretrained(tmp_path / "v5")
    prompt = tokenizer.encode("The quick brown fox")
    before = await client.generate(prompt, SamplingParams(max_new_tokens=120, temperature=0))
    task = asyncio.create_task(client.generate(prompt, SamplingParams(max_new_tokens=120, temperature=0)))
    await _wait_for_tokens(engine, len(before.output_ids) + 10)
    await client.update_weights(str(tmp_path / "v5"), version=5, abort_all_requests=True)
    result = await task
    assert client.version == 5 and result.meta["resubmits"] >= 1
    assert len(result.output_ids) == 120 and result.finish_reason == "length"
    switch = result.token_versions.index(5)
    assert 0 < switch and set(result.token_versions[:switch]) == {0} and set(result.token_versions[switch:]) == {5}
    assert result.output_ids[:switch] == before.output_ids[:switch]
    assert result.output_ids != before.output_ids


async def test_pause_abort_then_continue_resubmits(served, tokenizer):
    from envhub.trainer.engines.server.state import STATE_KEY

    engine, server, client = served
    state = server.runner.app[STATE_KEY]
    task = asyncio.create_task(
        client.generate(tokenizer.encode("Once"), SamplingParams(max_new_tokens=150, temperature=0), rid="once")
    )
    await _wait_for_tokens(engine, 5)
    await client.pause(mode="abort")
    while "once/r1" not in state.active:  # the client has resubmitted; the server holds it while paused
        await asyncio.sleep(0.005)
    assert engine.num_running == 0
    assert not task.done()
    await client.resume()
    result = await task
    assert len(result.output_ids) == 150 and result.meta["resubmits"] == 1


async def test_user_abort_is_not_resubmitted(served, tokenizer):
    engine, _, client = served
    task = asyncio.create_task(
        client.generate(tokenizer.encode("Go"), SamplingParams(max_new_tokens=400, temperature=0), rid="mine")
    )
    await _wait_for_tokens(engine, 3)
    await client.abort("mine")
    result = await task
    assert result.finish_reason == "abort" and result.meta["resubmits"] == 0


async def test_health_503_when_engine_closed(served):
    engine, _, client = served
    assert await client.health()
    await engine.close()
    assert not await client.health()


async def test_unreachable_server_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = SGLangEngine(f"http://127.0.0.1:{port}", retries=1)
    with pytest.raises(EngineError, match="cannot reach"):
        await client.generate([1, 2], GREEDY)
    assert not await client.health()
    with pytest.raises(EngineError, match="checkpoint directory or a state dict"):
        await client.update_weights(42)
    await client.close()


@pytest.mark.slow
async def test_serve_engine_cli_subprocess(tokenizer, tiny_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "envhub.cli.main",
            "serve-engine",
            "--model",
            "tiny",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--dtype",
            "float32",  # compared with an fp32 engine below
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    client = SGLangEngine(f"http://127.0.0.1:{port}", retries=0)
    try:
        for _ in range(600):
            if await client.health() or process.poll() is not None:
                break
            await asyncio.sleep(0.1)
        assert await client.health(), process.stdout.read().decode() if process.poll() is not None else "not healthy"
        prompt = tokenizer.encode("Hello there")
        remote = await client.generate(prompt, GREEDY)
        direct = EmbeddedEngine(tiny_model, tokenizer)  # `--model tiny` is tiny_llama(seed=0): the same weights
        assert remote.output_ids == (await direct.generate(prompt, GREEDY)).output_ids
        await direct.close()
    finally:
        await client.close()
        process.terminate()
        process.wait(timeout=30)


async def test_multi_engine_spreads_load_over_a_local_and_a_remote_engine(served, tiny_model, tokenizer):
    from envhub.trainer.engines.routing import MultiEngine

    remote_engine, _, client = served
    local = EmbeddedEngine(tiny_model, tokenizer)
    multi = MultiEngine([local, client])
    prompts = [tokenizer.encode(t) for t in ["a", "b c", "d e f", "g"]]
    results = await asyncio.gather(*[multi.generate(p, GREEDY) for p in prompts])
    assert sorted(r.meta["engine"] for r in results) == [0, 0, 1, 1]
    for result, prompt in zip(results, prompts):
        assert result.output_ids == (await local.generate(prompt, GREEDY)).output_ids
    assert await multi.health()
    await multi.close()
