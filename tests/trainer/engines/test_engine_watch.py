"""`WatchedEngine` against a real engine server (a EmbeddedEngine behind SGLang's HTTP API on 127.0.0.1) that goes
away: requests wait and are resubmitted, a restarted server gets the latest weights back, an outage past the
bound is EngineDown naming the URL, a request's own error is raised as it is, and one that never reached the server is
EngineUnreachable."""

import asyncio

import pytest

from envhub.errors import EngineError, EngineUnreachable
from envhub.inference import SamplingParams
from envhub.trainer.engines.watch import EngineDown, WatchedEngine

pytest.importorskip("envhub.trainer.engines.embedded.engine")
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.server.app import start_engine_server
from envhub.trainer.engines.sglang.client import SGLangEngine
from envhub.trainer.models import tiny_llama

SAMPLING = SamplingParams(max_new_tokens=4, temperature=0.0)


async def _serve(tokenizer, port=0):
    return await start_engine_server(EmbeddedEngine(tiny_llama(tokenizer, seed=0), tokenizer), port=port)


async def test_an_outage_is_waited_out_and_the_restarted_server_gets_the_latest_weights(tokenizer):
    server = await _serve(tokenizer)
    port = int(server.url.rsplit(":", 1)[1])
    engine = WatchedEngine(
        SGLangEngine(server.url, retries=0, tensor_format="safetensors"), max_outage_s=120, probe_interval_s=0.2
    )
    prompt = tokenizer("hello there")["input_ids"]
    try:
        trained = {k: v + 0.01 for k, v in tiny_llama(tokenizer, seed=0).state_dict().items()}
        await engine.update_weights(trained, version=3)
        assert (await engine.generate(prompt, SAMPLING)).weight_version == 3
        await server.stop()  # the server is gone: requests now wait for it
        waiting = [asyncio.ensure_future(engine.generate(prompt, SAMPLING)) for _ in range(3)]
        while not engine.outages:
            await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiting)
        server = await _serve(tokenizer, port)  # back on its port, with its initial weights
        results = await asyncio.gather(*waiting)
        assert [r.weight_version for r in results] == [3, 3, 3]  # re-pushed before any request was resubmitted
        assert engine.resubmitted == 3 and engine.outages == 1 and engine.metrics()["engine_down_s"] > 0
        info = await SGLangEngine(server.url).model_info()
        assert info["weight_version"] == "3"
    finally:
        await engine.close()
        await server.stop()


async def test_an_outage_past_the_bound_is_engine_down_naming_the_url_and_own_errors_pass_through(tokenizer):
    server = await _serve(tokenizer)
    engine = WatchedEngine(SGLangEngine(server.url, retries=0), max_outage_s=1.0, probe_interval_s=0.2)
    try:
        with pytest.raises(EngineError, match="generate") as refused:  # a request the healthy server refuses
            await engine.generate([10**9], SAMPLING)
        assert not isinstance(refused.value, (EngineDown, EngineUnreachable)) and engine.outages == 0
        await server.stop()
        # a call that never reached the server is an outage even if the server answers again by the time anyone
        # checks (restarted, with its initial weights): the client says so by the error's type
        with pytest.raises(EngineUnreachable, match="cannot reach"):
            await engine.inner.generate([1, 2, 3], SAMPLING)
        with pytest.raises(EngineDown, match=f"{server.url} stopped answering and was not back within 1 s"):
            await engine.generate([1, 2, 3], SAMPLING)
        with pytest.raises(EngineDown):  # every later call, and the trainer's check, fail at once
            engine.raise_if_failed()
    finally:
        await engine.close()


async def test_a_probe_of_a_server_that_drops_connections_asks_twice_whatever_the_clients_retries():
    """`health()` answers whether the server is up now: each retry of a dead server's probe would add its back-off
    to the watcher's probe period and to how long an outage past `max_outage_s` takes to be found (one retry stays,
    so that one dropped connection is not an outage)."""
    connections = []

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()  # accepted, then closed before any answer: a server dying under the request

    listener = await asyncio.start_server(drop, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    once, retrying = SGLangEngine(url, retries=0), SGLangEngine(url, retries=3)
    try:
        with pytest.raises(EngineUnreachable):  # a request of a client without retries: one attempt
            await once.model_info()
        per_attempt = len(connections)  # aiohttp itself may connect again once on a dropped connection
        assert await retrying.health() is False
        assert len(connections) == (1 + 2) * per_attempt  # the probe: 2 attempts, not the client's 1 + 3
        with pytest.raises(EngineUnreachable):  # a request is still retried: 1 + 3 attempts
            await retrying.model_info()
        assert len(connections) == (1 + 2 + 4) * per_attempt
    finally:
        await once.close()
        await retrying.close()
        listener.close()
        await listener.wait_closed()
