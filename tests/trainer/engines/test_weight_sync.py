"""Weight pushes against serve-engine with SGLang's semantics: blocking unless paused, spans, tensor and group paths."""

from __future__ import annotations

import asyncio

import pytest

from envhub.inference import SamplingParams
from envhub.trainer.engines.server.app import start_engine_server
from envhub.trainer.engines.server.state import STATE_KEY
from envhub.trainer.engines.sglang.client import SGLangEngine

torch = pytest.importorskip("torch")
LONG = SamplingParams(max_new_tokens=150, temperature=0)


@pytest.fixture
async def served(engine, tmp_path):
    server = await start_engine_server(engine, weights_dirs=[tmp_path])
    yield engine, server
    await server.stop()


async def _post(url, path, body):
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, json=body) as response:
            return response.status, await response.json()


async def _running(engine, tokens=5):
    while engine.num_running == 0 or engine.stats.tokens < tokens:
        await asyncio.sleep(0.005)


async def test_plain_update_waits_for_requests_in_flight(served, tokenizer, tmp_path):
    from envhub.trainer.models import tiny_llama

    engine, server = served
    tiny_llama(tokenizer, seed=3).save_pretrained(tmp_path / "v1")
    client = SGLangEngine(server.url, pause_mode="none")
    finished: list[str] = []  # completion order: no timing assumption (a fast engine ends `first` in 0.1 s)
    first = asyncio.create_task(client.generate([1, 2, 3], LONG))
    first.add_done_callback(lambda _: finished.append("first"))
    await _running(engine)
    update = asyncio.create_task(client.update_weights(str(tmp_path / "v1"), version=1))
    update.add_done_callback(lambda _: finished.append("update"))
    while not server.runner.app[STATE_KEY].gate.updating:
        await asyncio.sleep(0.005)
    late = asyncio.create_task(client.generate([4, 5], SamplingParams(max_new_tokens=3)))
    late.add_done_callback(lambda _: finished.append("late"))
    result = await first
    await update
    await late
    assert finished == ["first", "update", "late"]  # the update waits for `first`; `late` queues behind the update
    assert set(result.token_versions) == {0} and len(result.output_ids) == 150
    assert set((await late).token_versions) == {1}
    await client.close()


@pytest.mark.parametrize("mode", ["retract", "in_place"])
async def test_paused_update_keeps_requests_running_and_versions_per_token(served, tokenizer, tmp_path, mode):
    from envhub.trainer.models import tiny_llama

    engine, server = served
    tiny_llama(tokenizer, seed=3).save_pretrained(tmp_path / "v7")
    client = SGLangEngine(server.url, pause_mode=mode)
    task = asyncio.create_task(client.generate([1, 2, 3], LONG))
    await _running(engine, 10)
    await client.update_weights(str(tmp_path / "v7"), version=7)
    result = await task
    assert result.meta["resubmits"] == 0 and len(result.output_ids) == 150
    switch = result.token_versions.index(7)
    assert (
        0 < switch < 150 and set(result.token_versions[:switch]) == {0} and set(result.token_versions[switch:]) == {7}
    )
    await client.close()


async def test_state_dict_goes_over_update_weights_from_tensor_in_buckets(served, tokenizer):
    from envhub.trainer.models import tiny_llama

    engine, server = served
    client = SGLangEngine(server.url, tensor_format="safetensors", bucket_bytes=200_000)
    before = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=8, temperature=0))
    new = {n: p.detach() for n, p in tiny_llama(tokenizer, seed=9).named_parameters()}
    state = server.runner.app[STATE_KEY]
    labels_before = len(state.labels)
    await client.update_weights(new, version=2)
    after = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=8, temperature=0))
    assert after.output_ids != before.output_ids and set(after.token_versions) == {2}
    served_params = dict(engine.model.named_parameters())
    assert all(torch.equal(served_params[n], t) for n, t in new.items())  # every bucket arrived
    assert len(state.labels) - labels_before >= 3  # several buckets (one engine update each) ...
    assert list(state.labels.values())[-2] == "default"  # ... and only the last named the version
    assert state.session is None  # the client closed its weight-update session
    await client.close()


async def test_tensor_and_distributed_updates_need_a_session_as_in_sglang(served):
    from envhub.trainer.engines.weight_sync import encode_safetensors

    _, server = served
    body = {"serialized_named_tensors": [encode_safetensors({"model.norm.weight": torch.ones(64)})]}
    status, reply = await _post(server.url, "/update_weights_from_tensor", body)
    assert status == 400 and reply == {
        "success": False,
        "message": "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()",
    }
    assert (await _post(server.url, "/begin_weight_update", {}))[0] == 200
    status, reply = await _post(server.url, "/begin_weight_update", {})
    assert status == 400 and "already open" in reply["message"]
    status, reply = await _post(server.url, "/update_weights_from_tensor", body)
    assert status == 200 and reply["success"]
    # a push finds the session an interrupted push left open, closes it and runs its own
    client = SGLangEngine(server.url, tensor_format="safetensors")
    await client.update_weights({"model.norm.weight": torch.full((64,), 2.0)}, version=3)
    assert server.runner.app[STATE_KEY].session is None
    status, reply = await _post(server.url, "/end_weight_update", {})
    assert status == 400 and "no weight-update session" in reply["message"]
    await client.close()


async def test_in_place_pause_needs_flush_cache_false(served, tokenizer, tmp_path):
    """SGLang refuses to flush the cache while an in_place pause keeps its batch: an update asking for the flush
    loads the weights and still answers 400; the client sends flush_cache false in in_place mode."""
    from envhub.trainer.models import tiny_llama

    engine, server = served
    tiny_llama(tokenizer, seed=3).save_pretrained(tmp_path / "v1")
    client = SGLangEngine(server.url, pause_mode="in_place")
    task = asyncio.create_task(client.generate([1, 2, 3], LONG))
    await _running(engine)
    await client.pause("in_place")
    status, reply = await _post(server.url, "/update_weights_from_disk", {"model_path": str(tmp_path / "v1")})
    assert status == 400 and not reply["success"] and "cache was not flushed" in reply["message"]
    assert torch.equal(engine.model.model.norm.weight, tiny_llama(tokenizer, seed=3).model.norm.weight)  # loaded
    await client.resume()
    await client.update_weights(str(tmp_path / "v1"), version=4)  # in_place: flush_cache false, succeeds
    result = await task
    assert result.meta["resubmits"] == 0 and 4 in result.token_versions
    await client.close()


async def test_retract_pause_flushes_with_requests_waiting(served, tokenizer, tmp_path):
    from envhub.trainer.models import tiny_llama

    engine, server = served
    tiny_llama(tokenizer, seed=3).save_pretrained(tmp_path / "v1")
    client = SGLangEngine(server.url, pause_mode="retract")
    task = asyncio.create_task(client.generate([1, 2, 3], LONG))
    await _running(engine)
    await client.pause("retract")  # retracted requests wait; SGLang ignores waiting requests while paused
    status, reply = await _post(server.url, "/update_weights_from_disk", {"model_path": str(tmp_path / "v1")})
    assert status == 200 and reply["success"]
    await client.resume()
    assert len((await task).output_ids) == 150
    await client.close()


async def test_pickled_tensors_are_refused(served):
    import aiohttp

    from envhub.trainer.engines.weight_sync import encode_sglang

    _, server = served
    async with aiohttp.ClientSession() as http:
        body = {"serialized_named_tensors": encode_sglang({"w": torch.zeros(2)})}
        async with http.post(server.url + "/update_weights_from_tensor", json=body) as response:
            assert response.status == 400 and "never unpickles" in (await response.json())["error"]["message"]


def test_buckets_keep_every_tensor_and_flatten_aligned():
    from envhub.errors import EngineError
    from envhub.trainer.engines.weight_sync import flatten, plan_buckets, unflatten

    named = {
        "a": torch.arange(3, dtype=torch.bfloat16),
        "b": torch.arange(5, dtype=torch.float32).reshape(5, 1),
        "c": torch.arange(7, dtype=torch.int64),
        "big": torch.zeros(100),
        "d": torch.ones(2, 2, dtype=torch.float16),
    }
    buckets = plan_buckets(named, 100)
    assert [sorted(n for n, _ in b) for b in buckets] == [["a", "b", "c"], ["big"], ["d"]]
    for bucket in buckets:
        flat, meta = flatten(bucket)
        back = unflatten(flat, [m.name for m in meta], [str(m.dtype)[6:] for m in meta], [list(m.shape) for m in meta])
        assert all(torch.equal(named[n], t) and t.dtype == named[n].dtype for n, t in back)
        assert all(m.start_idx % m.dtype.itemsize == 0 for m in meta)  # wider dtypes first
    with pytest.raises(EngineError, match="unaligned"):
        unflatten(torch.zeros(6, dtype=torch.uint8), ["x", "y"], ["bfloat16", "float32"], [[1], [1]])
    with pytest.raises(EngineError, match="unknown dtype"):
        unflatten(torch.zeros(4, dtype=torch.uint8), ["x"], ["os"], [[1]])
    with pytest.raises(EngineError, match="metadata describes"):
        unflatten(torch.zeros(8, dtype=torch.uint8), ["x"], ["float32"], [[1]])


async def test_turns_of_one_episode_stick_to_one_engine(tiny_model, tokenizer):
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.engines.routing import MultiEngine, episode_key

    multi = MultiEngine([EmbeddedEngine(tiny_model, tokenizer), EmbeddedEngine(tiny_model, tokenizer)])

    async def episode(name: str) -> list[int]:
        episode_key.set(name)
        return [
            (await multi.generate([1, 2, turn + 3], SamplingParams(max_new_tokens=2))).meta["engine"]
            for turn in range(3)
        ]

    served = await asyncio.gather(*[episode(f"ep{i}") for i in range(4)])
    assert all(len(set(turns)) == 1 for turns in served)  # every turn of an episode on its first engine
    assert sorted(turns[0] for turns in served) == [0, 0, 1, 1]  # new episodes still spread by load
    await multi.close()


def test_pause_mode_and_api_key_come_from_config(monkeypatch):
    from envhub.errors import ConfigError
    from envhub.trainer.config import config_from_dict
    from envhub.trainer.engines.routing import http_engines

    base = {"tasks": [{"env": "Letters-v0"}], "engine": {"kind": "sglang", "url": "http://127.0.0.1:1"}}
    with pytest.raises(ConfigError, match="pause_mode"):
        config_from_dict({**base, "engine": {**base["engine"], "pause_mode": "later"}})
    config = config_from_dict({**base, "engine": {**base["engine"], "pause_mode": "in_place", "api_key": "k"}})
    client = http_engines(config.engine.url, api_key=config.engine.api_key, pause_mode=config.engine.pause_mode)
    assert client.pause_mode == "in_place" and client.api_key == "k"
    monkeypatch.setenv("ENVHUB_ENGINE_API_KEY", "from-env")
    assert SGLangEngine("http://127.0.0.1:1").api_key == "from-env"


async def test_in_process_push_to_the_served_engine_reads_as_its_number(served, tokenizer):
    from envhub.trainer.models import tiny_llama

    engine, server = served
    await engine.update_weights({n: p.detach() for n, p in tiny_llama(tokenizer, seed=5).named_parameters()}, version=4)
    client = SGLangEngine(server.url)
    result = await client.generate([1, 2], SamplingParams(max_new_tokens=2))
    assert result.token_versions == [4, 4] and (await client.model_info())["weight_version"] == "4"
    await client.close()
