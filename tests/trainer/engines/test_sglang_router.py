"""sglang-router 0.3.2 (the real Rust router, which runs on CPU) in front of two serve-engine workers.

Generation goes through the router with each episode pinned to one worker (manual policy, X-SMG-Routing-Key);
weight pushes, pauses and aborts go to every worker (the router has no such routes).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest

from envhub.inference import SamplingParams
from envhub.trainer.engines.episodes import episode_key
from envhub.trainer.engines.sglang import SGLangEngine
from envhub.trainer.engines.sglang_deploy import SGLangDeployment
from envhub.trainer.engines.sglang_launch import router_args
from tests.sglang_support import recorded_server

pytest.importorskip("sglang_router")
torch = pytest.importorskip("torch")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def cluster(tokenizer, tmp_path):
    """Two recorded serve-engine workers and sglang-router started with envhub's router command line."""
    from envhub.trainer.engines.local import LocalEngine
    from envhub.trainer.models import tiny_llama

    engines = [LocalEngine(tiny_llama(tokenizer, seed=0), tokenizer) for _ in range(2)]
    workers = [await recorded_server(e, weights_dirs=[tmp_path]) for e in engines]
    urls = [w[0] for w in workers]
    port = _free_port()
    log = open(tmp_path / "router.log", "wb")
    router = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", *router_args(urls, "127.0.0.1", port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deployment = SGLangDeployment([SGLangEngine(u) for u in urls], router_url=f"http://127.0.0.1:{port}")
    try:
        for _ in range(600):
            if router.poll() is not None:
                pytest.fail((tmp_path / "router.log").read_text()[-3000:])
            if await deployment.health():
                break
            await asyncio.sleep(0.1)
        yield deployment, engines, [w[1] for w in workers]
    finally:
        await deployment.close()
        router.terminate()
        router.wait(timeout=30)
        log.close()
        for _, _, runner, _ in workers:
            await runner.cleanup()


async def test_episodes_stick_to_one_worker_through_the_router(cluster):
    deployment, _, bodies = cluster

    async def episode(name: str) -> None:
        episode_key.set(name)
        for turn in range(3):
            await deployment.generate([1, 2, 3 + turn], SamplingParams(max_new_tokens=2), rid=f"{name}-t{turn}")

    names = [f"ep{i}" for i in range(6)]
    for name in names:
        await episode(name)
    served = [{b["rid"].split("-")[0] for p, b in worker if p == "/generate"} for worker in bodies]
    # every turn of an episode on the worker its first turn went to (unpinned, 6 three-turn episodes would all
    # stay together with probability (1/4)^6)
    assert served[0] | served[1] == set(names) and not served[0] & served[1], served


async def test_pushes_pauses_and_aborts_go_to_every_worker(cluster, tokenizer, tmp_path):
    from envhub.trainer.models import tiny_llama

    deployment, engines, bodies = cluster
    tiny_llama(tokenizer, seed=5).save_pretrained(tmp_path / "v1")
    await deployment.update_weights(str(tmp_path / "v1"), version=1)
    for worker in bodies:
        paths = [p for p, _ in worker]
        assert paths.count("/pause_generation") == paths.count("/update_weights_from_disk") == 1
    assert [await e.get_weight_version() for e in deployment.workers.engines] == [1, 1]
    result = await deployment.generate([1, 2], SamplingParams(max_new_tokens=3))
    assert result.token_versions == [1, 1, 1]  # the router passes SGLang's weight_versions spans through

    episode_key.set("long")
    task = asyncio.create_task(
        deployment.generate([4, 5], SamplingParams(max_new_tokens=400, temperature=0), rid="long")
    )
    while not any(e.num_running for e in engines):
        await asyncio.sleep(0.005)
    await deployment.pause(mode="abort")  # the client resubmits through the router as long/r1 ...
    await deployment.resume()
    while not any(b.get("rid") == "long/r1" for worker in bodies for p, b in worker if p == "/generate"):
        await asyncio.sleep(0.005)
    while not any(e.num_running for e in engines):
        await asyncio.sleep(0.005)
    await deployment.abort("long")  # ... so the abort names long/r1, and goes to both workers
    result = await asyncio.wait_for(task, 60)
    assert result.finish_reason == "abort" and len(result.output_ids) < 400
    assert all(("/abort_request", {"rid": "long/r1"}) in worker for worker in bodies)
