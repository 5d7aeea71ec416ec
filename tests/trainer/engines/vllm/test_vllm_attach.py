"""Attaching to `engine.url` with kind vllm checks the server first: a wrong URL is a clear error before the run
starts, not an error in every episode. Real servers on 127.0.0.1 (no vLLM needed: these are the wrong ones)."""

from __future__ import annotations

import pytest

from envhub.errors import EngineError
from envhub.trainer.config import config_from_dict
from envhub.trainer.engines import build_engine
from envhub.trainer.engines.launcher import free_port
from envhub.trainer.engines.server.app import start_engine_server
from envhub.trainer.engines.vllm.engine import VLLMEngine


async def test_attaching_where_nothing_listens_names_the_url_and_how_to_start_one():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=f"no server answers at {url}/health") as caught:
        await VLLMEngine.attach(url, retries=0)
    assert "serve-engine --backend vllm" in (caught.value.hint or "")


async def test_attaching_to_envhubs_own_engine_server_says_it_is_not_vllm(engine, tiny_model, tokenizer):
    server = await start_engine_server(engine)  # healthy, but SGLang's protocol: /version and /is_paused are 404
    try:
        with pytest.raises(EngineError, match="is not vLLM: GET /version answered 404"):
            await VLLMEngine.attach(server.url, retries=0)
        config = config_from_dict(
            {
                "model": {"name": "tiny"},
                "engine": {"kind": "vllm", "url": server.url},
                "tasks": [{"env": "Letters-v0", "weight": 1.0}],
            }
        )
        with pytest.raises(EngineError, match="is not vLLM"):  # the trainer's path: before any rollout
            await build_engine(config, tiny_model, tokenizer)
    finally:
        await server.stop()
