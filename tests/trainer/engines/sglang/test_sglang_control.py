"""The client's control traffic against SGLang 0.5.23's own code: request structs, tensor payloads, process group.

Every body the client sends to serve-engine is recorded and parsed the way SGLang's HTTP server parses it (its
io_struct structs under pydantic); tensor payloads are decoded by SGLang's MultiprocessingSerializer (its
SafeUnpickler allow-list) and FlattenedTensorBucket in another process; the trainer's rank 0 forms a process
group with SGLang's `init_custom_process_group` in another process and broadcasts to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import socket
import types

import aiohttp
import pytest

from envhub.errors import EngineError
from envhub.inference import SamplingParams
from envhub.trainer.engines.sglang.client import SGLangEngine
from tests.sglang_support import (
    decode_in_child,
    io_structs,
    parse_as_sglang,
    receive_in_child,
    recorded_server,
    sglang_module,
)

torch = pytest.importorskip("torch")

ROUTES = {
    "/pause_generation": "PauseGenerationReqInput",
    "/continue_generation": "ContinueGenerationReqInput",
    "/abort_request": "AbortReq",
    "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "/update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
    "/begin_weight_update": "BeginWeightUpdateReqInput",
    "/end_weight_update": "EndWeightUpdateReqInput",
}


@pytest.fixture(scope="module")
def child():
    """One spawned Python process (SGLang's code runs there, as in a separate server)."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


@pytest.fixture
async def recorded(engine, tmp_path):
    """serve-engine with a middleware that records every (path, JSON body) it receives."""
    url, bodies, runner, state = await recorded_server(engine, weights_dirs=[tmp_path], health_check_timeout=0.5)
    yield url, bodies, state
    await runner.cleanup()


async def test_every_control_body_parses_as_sglangs_struct(recorded, engine, tokenizer, tmp_path):
    from envhub.trainer.models import tiny_llama

    url, bodies, _ = recorded
    structs = io_structs()
    api = sglang_module("sglang.api.v1.api_types")
    tiny_llama(tokenizer, seed=2).save_pretrained(tmp_path / "w")
    new = {n: p.detach() for n, p in tiny_llama(tokenizer, seed=2).named_parameters()}
    for mode in ("retract", "in_place", "abort"):
        client = SGLangEngine(url, pause_mode=mode, tensor_format="safetensors", bucket_bytes=300_000)
        await client.generate([1, 2], SamplingParams(max_new_tokens=2), rid=f"r-{mode}")
        await client.update_weights(str(tmp_path / "w"), version=1, abort_all_requests=True)
        await client.update_weights(new, version=2)
        await client.abort("r-gone")
        await client.abort()
        await client.close()
    client = SGLangEngine(url)
    with pytest.raises(EngineError):  # rank 5 of 2: refused at once, but the body was sent
        await client.init_weights_update_group("127.0.0.1", 1, 5, 2, backend="gloo")
    with pytest.raises(EngineError, match="no weight update group"):
        group = types.SimpleNamespace(name="weight_update_group")
        await client.update_weights_from_distributed(new, group, version=3, broadcast=False)
    with pytest.raises(EngineError, match="does not exist"):
        await client.destroy_weights_update_group()
    await client.close()
    assert {path for path, _ in bodies} == set(ROUTES) | {"/generate"}
    for path, body in bodies:
        struct = api.GenerateRequest if path == "/generate" else getattr(structs, ROUTES[path])
        parsed = struct.from_json_value(body) if path == "/generate" else parse_as_sglang(struct, body)
        fields = set(getattr(struct, "__struct_fields__", ())) or set(type(parsed).__annotations__)
        if path != "/generate":
            assert set(body) <= fields, f"{path}: SGLang ignores {set(body) - fields}"  # no silently dropped key
    flushes = {(p, b.get("flush_cache", True)) for p, b in bodies if p.startswith("/update_weights")}
    assert ("/update_weights_from_disk", False) in flushes and ("/update_weights_from_disk", True) in flushes


async def test_in_place_pushes_never_flush_and_only_the_last_bucket_names_the_version(recorded, tokenizer):
    from envhub.trainer.models import tiny_llama

    url, bodies, _ = recorded
    structs = io_structs()
    new = {n: p.detach() for n, p in tiny_llama(tokenizer, seed=2).named_parameters()}
    for mode in ("in_place", "retract"):
        client = SGLangEngine(url, pause_mode=mode, tensor_format="safetensors", bucket_bytes=300_000)
        bodies.clear()
        await client.update_weights(new, version=7)
        updates = [parse_as_sglang(structs.UpdateWeightsFromTensorReqInput, b) for p, b in bodies if "tensor" in p]
        assert len(updates) >= 3
        assert [u.flush_cache for u in updates] == [False] * (len(updates) - 1) + [mode != "in_place"]
        assert [u.weight_version for u in updates] == [None] * (len(updates) - 1) + ["7"]
        paths = [p for p, _ in bodies]
        assert paths[:2] == ["/pause_generation", "/begin_weight_update"]
        assert paths[-2:] == ["/end_weight_update", "/continue_generation"]
        await client.close()


async def test_abort_reaches_the_resubmitted_attempt(recorded, engine):
    """After a pause in abort mode the live request is `<rid>/r1`; SGLang drops aborts of a rid not live, so the
    client must name the attempt, not the original rid."""
    url, bodies, state = recorded
    client = SGLangEngine(url)
    task = asyncio.create_task(client.generate([5, 6], SamplingParams(max_new_tokens=400, temperature=0), rid="ep"))
    while engine.num_running == 0:
        await asyncio.sleep(0.005)
    await client.pause("abort")
    while "ep/r1" not in state.active:
        await asyncio.sleep(0.005)
    await client.resume()
    while engine.num_running == 0:
        await asyncio.sleep(0.005)
    await client.abort("ep")
    result = await asyncio.wait_for(task, 60)
    assert result.finish_reason == "abort" and result.meta["resubmits"] == 1 and len(result.output_ids) < 400
    assert ("/abort_request", {"rid": "ep/r1"}) in bodies
    await client.close()


async def test_health_generates_and_waits_out_a_pause_ready_does_not(recorded):
    """SGLang's /health submits a 1-token generation: on a paused server it times out and marks the server
    unhealthy (/ready 503 until a later /health passes). The client's health() never calls it."""
    url, _, state = recorded
    client = SGLangEngine(url)
    async with aiohttp.ClientSession() as http:

        async def status(path):
            async with http.get(url + path) as response:
                return response.status

        assert await status("/health") == 200 and await status("/ready") == 200
        await client.pause("retract")
        assert await client.health() and state.healthy  # /ready says paused; /model_info answers
        assert await status("/ready") == 503
        assert await status("/health") == 503 and not state.healthy  # the probe waited 0.5 s behind the pause
        await client.resume()
        assert await status("/ready") == 503 and not await client.health()  # unhealthy until a check passes
        assert await status("/health") == 200 and await status("/ready") == 200 and await client.health()
    await client.close()


@pytest.mark.parametrize("flattened", [False, True], ids=["named-tensors", "flattened-bucket"])
def test_sglang_payloads_decode_with_sglangs_own_unpickler(child, flattened):
    from envhub.trainer.engines.weight_sync import encode_sglang

    named = {
        "model.norm.weight": torch.linspace(-1, 1, 6, dtype=torch.bfloat16),
        "lm_head.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "model.embed.weight": torch.arange(4, dtype=torch.float16),
    }
    payloads = encode_sglang(named, tp_size=2, flattened=flattened)
    assert len(payloads) == 2 and payloads[0] != payloads[1]  # serialised once per rank
    decoded = child.submit(decode_in_child, payloads, flattened).result(timeout=300)
    for rank in decoded:
        assert {name: (values, dtype) for name, values, dtype in rank} == {
            name: (t.float().tolist(), str(t.dtype)) for name, t in named.items()
        }


def test_sglangs_unpickler_refuses_envhub_classes(child):
    """The allow-list takes only torch, builtins and SGLang's own containers: a payload naming any other class
    (an envhub dataclass, say) is refused, which is why flattened metadata travels as SimpleNamespace."""
    import base64
    import pickle

    from envhub.inference import SamplingParams as Foreign

    payload = base64.b64encode(pickle.dumps([("x", Foreign())])).decode()
    with pytest.raises(RuntimeError, match="Blocked unsafe global"):
        child.submit(decode_in_child, [payload], False).result(timeout=300)


def test_trainer_rank0_forms_sglangs_process_group_and_broadcasts(child):
    from envhub.trainer.engines.weight_sync import WeightGroup, plan_buckets

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    named = {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.linspace(0, 1, 5, dtype=torch.bfloat16),
        "c": torch.arange(3, dtype=torch.int64),
    }
    buckets = plan_buckets(named, 40)
    meta = [
        ([n for n, _ in b], [str(t.dtype)[6:] for _, t in b], [list(t.shape) for _, t in b], fmt)
        for b, fmt in zip(buckets, ["flattened_bucket", None] * len(buckets))
    ]
    received = child.submit(receive_in_child, port, 2, 1, meta)
    group = WeightGroup.join("127.0.0.1", port, 0, 2, "gloo", torch.device("cpu"), group_name="g1", timeout_s=120)
    for bucket, (_, _, _, fmt) in zip(buckets, meta):
        group.send(bucket, flattened=fmt == "flattened_bucket")
    got = dict(received.result(timeout=300))
    group.close()
    assert len(buckets) >= 2 and got == {n: t.float().tolist() for n, t in named.items()}
