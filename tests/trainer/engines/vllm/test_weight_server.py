"""The trainer's weight server (engine.weight_sync: http): the latest push as one safetensors file, only to holders of
its token; a server that cannot fetch weights is refused before the run, naming the flags that fix it."""

import aiohttp
import pytest
import torch
from safetensors.torch import load

from envhub.errors import ConfigError, EngineError
from envhub.trainer.config import config_from_dict
from envhub.trainer.engines.vllm.engine import VLLMEngine
from envhub.trainer.engines.vllm.weight_server import WeightServer


async def test_it_serves_the_latest_push_to_its_token_only():
    server = await WeightServer().start()
    tied = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    state = {"embed.weight": tied, "lm_head.weight": tied, "norm.weight": torch.ones(3)}  # tied: one storage
    url = await server.publish(1, state)
    assert url == f"{server.url}/weights/v1" and server.url.startswith("http://127.0.0.1:")
    auth = {"Authorization": f"Bearer {server.token}"}
    async with aiohttp.ClientSession() as client:
        async with client.get(url, headers=auth) as response:
            assert response.status == 200
            fetched = load(await response.read())
        assert set(fetched) == set(state) and all(torch.equal(fetched[k], v) for k, v in state.items())
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {server.token}"}):
            async with client.get(url, headers=headers) as response:
                assert response.status == 401
        await server.publish(2, {"norm.weight": torch.zeros(3)})
        async with client.get(url, headers=auth) as response:  # v1 is gone once v2 is published
            assert response.status == 404 and "the latest is 2" in (await response.json())["error"]
        async with client.get(f"{server.url}/weights/latest", headers=auth) as response:
            assert response.status == 404
    assert server.fetches == 1
    await server.stop()


async def test_a_server_without_envhubs_extension_is_refused_with_the_flags(tmp_path):
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.engines.server.app import start_engine_server
    from envhub.trainer.models import load_tokenizer, tiny_llama

    tokenizer = load_tokenizer("tiny")
    running = await start_engine_server(EmbeddedEngine(tiny_llama(tokenizer), tokenizer))  # no /collective_rpc
    engine = VLLMEngine(running.url, retries=0)
    with pytest.raises(EngineError, match="cannot fetch weights over HTTP") as caught:
        await engine.check_weight_fetch()
    assert "--worker-extension-cls envhub_vllm_weights.WeightFetcher" in caught.value.hint
    await engine.close()
    await running.stop()


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"kind": "vllm", "weight_sync": "nccl"}, "weight_sync nccl is for kind: sglang, not kind: vllm"),
        ({"kind": "vllm", "servers": 0}, "engine.servers must be at least 1"),
        ({"kind": "vllm", "servers": 2, "url": "http://127.0.0.1:1"}, "not both"),
        ({"kind": "sglang", "url": "http://127.0.0.1:1", "weight_sync": "http"}, "weight_sync http is kind vllm's"),
        ({"kind": "embedded", "weight_sync": "http"}, "for kind: sglang, not kind: embedded"),
    ],
)
def test_weight_sync_and_servers_are_checked_per_kind(engine, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"model": {"name": "tiny", "tiny_heads": 2}, "tasks": [{"env": "Math-v0"}], "engine": engine})
