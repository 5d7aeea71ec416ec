"""serve-engine treats clients as hostile: weights only from allowed dirs, bounded bodies, vanished clients aborted."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from envhub.inference import SamplingParams
from envhub.trainer.engines.server.app import start_engine_server

torch = pytest.importorskip("torch")


@pytest.fixture
async def served(engine, tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    server = await start_engine_server(engine, weights_dirs=[allowed], max_body_bytes=1024 * 1024)
    yield engine, server, allowed
    await server.stop()


async def post(url, path, **kwargs):
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, **kwargs) as response:
            return response.status, await response.text()


async def test_weights_outside_allowed_dirs_or_not_safetensors_are_refused(served, tokenizer, tmp_path):
    from envhub.trainer.models import tiny_llama

    engine, server, allowed = served
    outside = tmp_path / "outside"
    tiny_llama(tokenizer, seed=2).save_pretrained(outside)
    (allowed / "link").symlink_to(outside)
    (allowed / "model.bin").write_bytes(b"\x80\x04pickle")
    before = {n: p.clone() for n, p in engine.model.named_parameters()}
    for path, load_format, why in [
        (str(outside), None, "outside"),
        (str(allowed / ".." / "outside"), None, "outside"),
        (str(allowed / "link"), None, "outside"),
        (str(allowed / "model.bin"), None, "safetensors"),
        (str(allowed), "pt", "safetensors"),
        (str(allowed), None, "no safetensors"),
        ("", None, "non-empty"),
        ("/etc/passwd", None, "outside"),
    ]:
        status, text = await post(
            server.url, "/update_weights_from_disk", json={"model_path": path, "load_format": load_format}
        )
        assert status == 400 and why in text, (path, text)
    assert all(torch.equal(before[n], p) for n, p in engine.model.named_parameters())  # nothing was loaded
    assert await engine.health()


async def test_oversized_and_malformed_bodies(served):
    _, server, _ = served
    status, _ = await post(
        server.url, "/generate", data=b"x" * (2 * 1024 * 1024), headers={"Content-Type": "application/json"}
    )
    assert status == 413
    for data in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        status, text = await post(server.url, "/generate", data=data, headers={"Content-Type": "application/json"})
        assert status == 400, text
    status, _ = await post(server.url, "/generate", json={"input_ids": [10**9]})
    assert status == 400
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/health") as response:
            assert response.status == 200


async def test_a_client_that_vanishes_mid_generation_is_aborted(served):
    engine, server, _ = served
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True}}
    session = aiohttp.ClientSession()
    request = asyncio.create_task(session.post(server.url + "/generate", json=body))
    for _ in range(3000):
        if engine.num_running or request.done():
            break
        await asyncio.sleep(0.01)
    assert engine.num_running == 1, "the request never started"
    request.cancel()
    await session.close()
    for _ in range(500):
        if engine.num_running == 0:
            break
        await asyncio.sleep(0.02)
    assert engine.num_running == 0 and engine.stats.tokens < 2000


async def test_ignore_eos_and_min_new_tokens_in_the_engine(tiny_model, tokenizer):
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine

    probe = EmbeddedEngine(tiny_model, tokenizer)
    first = (await probe.generate([1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0))).output_ids[0]
    await probe.close()
    engine = EmbeddedEngine(tiny_model, tokenizer, eos_token_ids=(first,))
    stopped = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=6, temperature=0))
    ignored = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True))
    held = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=6, temperature=0, min_new_tokens=3))
    await engine.close()
    assert stopped.output_ids == [first] and stopped.finish_reason == "stop"
    assert len(ignored.output_ids) == 6 and ignored.output_ids[0] == first
    assert held.output_ids[0] != first and len(held.output_ids) >= 3


async def test_malformed_weight_updates_are_refused_before_anything_is_received(served):
    """A distributed update announcing tensors the model lacks, odd dtypes or shapes is a 400 before the server
    allocates or joins a broadcast; admin-ish fields of the wrong type too."""
    from envhub.trainer.engines.server.state import STATE_KEY

    engine, server, allowed = served
    state = server.runner.app[STATE_KEY]
    state.weight_groups["weight_update_group"] = object()  # never reached: every body below is refused first
    assert (await post(server.url, "/begin_weight_update", json={}))[0] == 200
    norm = list(engine.model.model.norm.weight.shape)
    for body, why in [
        ({"names": ["model.norm.weight"], "dtypes": ["os"], "shapes": [norm]}, "unknown dtype"),
        ({"names": ["model.norm.weight"], "dtypes": ["__class__"], "shapes": [norm]}, "unknown dtype"),
        ({"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[-1]]}, "non-negative"),
        ({"names": ["nope"], "dtypes": ["float32"], "shapes": [[4]]}, "no tensor 'nope'"),
        ({"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[10**12]]}, "shape mismatch"),
        ({"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [norm, norm]}, "same length"),
        ({"names": "model.norm.weight", "dtypes": ["float32"], "shapes": [norm]}, "non-empty lists"),
        ({"names": [], "dtypes": [], "shapes": []}, "non-empty lists"),
    ]:
        status, text = await post(server.url, "/update_weights_from_distributed", json=body)
        assert status == 400 and why in text, (body, text)
    for path, body, why in [
        ("/update_weights_from_disk", {"model_path": str(allowed), "flush_cache": "no"}, "must be a boolean"),
        ("/begin_weight_update", {"selector": "everything"}, "selector must be one of"),
        ("/update_weights_from_tensor", {"serialized_named_tensors": ["AAAA"], "load_format": "direct"}, "null"),
        (
            "/init_weights_update_group",
            {"master_address": "h", "master_port": 1, "group_name": "g"},
            "needs rank_offset",
        ),
        ("/destroy_weights_update_group", {"group_name": ["x"]}, "does not exist"),
    ]:
        status, text = await post(server.url, path, json=body)
        assert status == 400 and why in text, (path, text)
    state.weight_groups.clear()
    assert await engine.health()


async def test_a_body_trickled_past_the_deadline_is_a_408_and_others_are_served(engine):
    server = await start_engine_server(engine, body_timeout_s=1.0)
    host, port = server.url.removeprefix("http://").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        await writer.drain()  # then nothing more: the handler must not wait for the rest forever
        status, _ = await post(
            server.url, "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
        )
        assert status == 200  # meanwhile another client is served
        head = await asyncio.wait_for(reader.readline(), 60)
        assert b" 408 " in head, head
        writer.close()
    finally:
        await server.stop()
