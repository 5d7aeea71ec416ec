"""sglang-router 0.3.2 (the real Rust router, which runs on CPU) in front of two serve-engine workers.

Generation goes through the router with each episode pinned to one worker (manual policy, X-SMG-Routing-Key);
weight pushes, pauses and aborts go to every worker (the router has no such routes).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from envhub.errors import EngineError
from envhub.inference import SamplingParams
from envhub.trainer.engines.launcher import ManagedServer, free_port, module_command
from envhub.trainer.engines.protocol import episode_key
from envhub.trainer.engines.sglang.client import SGLangEngine
from envhub.trainer.engines.sglang.deploy import SGLangDeployment
from envhub.trainer.engines.sglang.launch import (
    ROUTER_MODULE,
    LaunchPlan,
    PlannedServer,
    ServerCommand,
    launch,
    router_args,
    server_env,
    start_managed,
)
from tests.sglang_support import recorded_server

pytest.importorskip("sglang_router")
torch = pytest.importorskip("torch")


@pytest.fixture
async def cluster(tokenizer, tmp_path):
    """Two recorded serve-engine workers and sglang-router started with envhub's router command line."""
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.models import tiny_llama

    engines = [EmbeddedEngine(tiny_llama(tokenizer, seed=0), tokenizer) for _ in range(2)]
    workers = [await recorded_server(e, weights_dirs=[tmp_path]) for e in engines]
    urls = [w[0] for w in workers]
    port = free_port()
    router = ManagedServer.start(
        "router", module_command(sys.executable, ROUTER_MODULE, router_args(urls, "127.0.0.1", port)), env=server_env()
    )
    deployment = SGLangDeployment([SGLangEngine(u) for u in urls], router_url=f"http://127.0.0.1:{port}")
    try:
        await router.wait_ready(f"http://127.0.0.1:{port}/readiness", timeout=300)  # both workers healthy
        assert await deployment.health()
        yield deployment, engines, [w[1] for w in workers], router
    finally:
        await deployment.close()
        await asyncio.to_thread(router.stop)
        for _, _, runner, _ in workers:
            await runner.cleanup()


async def test_episodes_stick_to_one_worker_through_the_router(cluster):
    deployment, _, bodies, _ = cluster

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

    deployment, engines, bodies, _ = cluster
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


def _serve_engine(name: str, port: int, *extra: str) -> ServerCommand:
    args = ("serve-engine", "--model", "tiny", "--device", "cpu", "--port", str(port), *extra)
    return ServerCommand(name, sys.executable, "envhub.cli.main", args, server_env())


async def test_launch_starts_servers_then_the_router_and_close_stops_them(tmp_path):
    """`launch()` with envhub's managed-process launcher: serve-engine stands in for sglang.launch_server
    (which needs CUDA), the router is started from router_args; the deployment starts them at first use,
    reports a worker that dies, and stops everything on close."""
    ports = [free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{p}" for p in ports[:2]]
    plan = LaunchPlan(
        tuple(
            PlannedServer(u, u + "/ready", (), 1, _serve_engine(f"w{i}", p))
            for i, (u, p) in enumerate(zip(urls, ports))
        ),
        ServerCommand(
            "router", sys.executable, ROUTER_MODULE, tuple(router_args(urls, "127.0.0.1", ports[2])), server_env()
        ),
        f"http://127.0.0.1:{ports[2]}",
        startup_timeout=600,
    )
    deployment = SGLangDeployment([SGLangEngine(u) for u in urls], router_url=plan.router_url, plan=plan)
    assert not await deployment.health()  # nothing runs before the first use
    episode_key.set("e1")
    result = await deployment.generate([1, 2, 3], SamplingParams(max_new_tokens=3))
    assert len(result.output_ids) == 3 and await deployment.health()
    processes = [*deployment.launched.servers, deployment.launched.router]
    assert all(p.returncode is None for p in processes)
    deployment.raise_if_failed()  # all running: nothing to raise
    os.kill(processes[1].pid, signal.SIGKILL)  # a worker dies under the run
    await asyncio.to_thread(processes[1].process.wait)
    with pytest.raises(EngineError, match="the w1 server .* was killed by signal 9"):
        deployment.raise_if_failed()  # what the training loop checks between steps
    with pytest.raises(EngineError, match="the w1 server"):
        await deployment.generate([1, 2, 3], SamplingParams(max_new_tokens=3))
    await deployment.close()
    assert all(p.returncode is not None for p in processes) and not await SGLangEngine(urls[0], retries=0).health()


async def test_a_server_that_fails_to_start_stops_the_others(tmp_path):
    ports = [free_port() for _ in range(2)]
    good, bad = (f"http://127.0.0.1:{p}" for p in ports)
    missing = str(tmp_path / "no-model")
    plan = LaunchPlan(
        (
            PlannedServer(good, good + "/ready", (), 1, _serve_engine("good", ports[0])),
            PlannedServer(bad, bad + "/ready", (), 1, _serve_engine("bad", ports[1], "--model", missing)),
        ),
        startup_timeout=600,
    )
    started = []

    async def start(command, ready_url, timeout):
        server = await start_managed(command, ready_url, timeout)
        started.append(server)
        return server

    with pytest.raises(EngineError, match="the bad server"):
        await launch(plan, start)
    assert len(started) == 1 and started[0].returncode is not None  # the good one was stopped again


async def test_router_traffic_follows_sglangs_models_and_has_no_control_routes(cluster, tokenizer, tmp_path):
    """A /generate built with SGLang's own request model goes through the router, and what comes back parses as
    SGLang's GenerateResponse with its weight_versions spans; the control routes are not the router's (404), which
    is why pushes, pauses and aborts go to each worker."""
    import aiohttp

    from envhub.trainer.models import tiny_llama
    from tests.sglang_support import sglang_module

    api = sglang_module("sglang.api.v1.api_types")
    deployment, _, bodies, _ = cluster
    tiny_llama(tokenizer, seed=7).save_pretrained(tmp_path / "v3")
    await deployment.update_weights(str(tmp_path / "v3"), version=3)
    request = api.GenerateRequest(
        input_ids=[1, 2, 3],
        sampling_params=api.SamplingParams(max_new_tokens=4, temperature=0.0),
        return_logprob=True,
        rid="through-router",
    )
    router = deployment.router.url
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{router}/generate", json=request.to_json_value()) as response:
            assert response.status == 200
            meta = api.GenerateResponse.from_json_value(await response.json()).meta_info
        async with http.get(f"{router}/get_model_info") as response:  # passed through to a worker
            assert response.status == 200 and (await response.json())["weight_version"] == "3"
        async with http.get(f"{router}/model_info") as response:  # 0.3.2 routes only the deprecated name
            assert response.status == 404
        for path in ("/update_weights_from_disk", "/pause_generation", "/abort_request", "/init_weights_update_group"):
            async with http.post(f"{router}{path}", json={}) as response:
                assert response.status == 404, path
    assert meta.id == "through-router" and meta.completion_tokens == 4 and len(meta.output_token_logprobs) == 4
    assert meta.weight_version == "3" and [(s.version, s.start, s.end) for s in meta.weight_versions] == [("3", 0, 4)]
    assert sum(b.get("rid") == "through-router" for worker in bodies for p, b in worker if p == "/generate") == 1


async def test_attaching_checks_every_url_and_names_a_router_given_as_a_server(cluster):
    deployment, _, _, _ = cluster
    await deployment.check_attached()  # serve-engine workers answer /model_info as SGLang; the router /readiness
    router, worker = deployment.router.url, deployment.workers.engines[0].url
    swapped = SGLangDeployment([SGLangEngine(router, retries=0)])
    with pytest.raises(EngineError, match=f"engine.url {router} is an sglang-router") as caught:
        await swapped.check_attached()
    assert "engine.router_url" in caught.value.hint
    not_a_router = SGLangDeployment([SGLangEngine(worker)], router_url=worker)
    with pytest.raises(EngineError, match=f"engine.router_url {worker} does not answer /readiness"):
        await not_a_router.check_attached()
    for client in (swapped, not_a_router):
        await client.close()


@pytest.mark.slow
async def test_a_training_run_generates_through_the_router_and_pushes_to_each_worker(cluster, tmp_path):
    """engine.url (the workers) + engine.router_url (the real router): rollouts go through the router, each
    step's weights to every worker, and the first step's KL check finds the router's logprobs are the learner's."""
    from envhub.trainer.config import config_from_dict
    from envhub.trainer.train import Trainer

    deployment, _, bodies, router = cluster
    engine = {"kind": "sglang", "url": ",".join(w.url for w in deployment.workers.engines)}
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "engine": {**engine, "router_url": deployment.router.url},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 4, "max_new_tokens": 4, "max_turns": 1},
            "algorithm": {"groups_per_step": 2, "lr": 0.01, "mode": "sync"},
            "budget": {"steps": 2, "checkpoint_every": 10},
            "out_dir": str(tmp_path / "run"),
        }
    )
    result = await Trainer(config).run()
    assert result.last_step == 2
    assert [await w.get_weight_version() for w in deployment.workers.engines] == [2, 2]
    for worker in bodies:
        assert [p for p, _ in worker].count("/update_weights_from_disk") == 2
    generated = sum(p == "/generate" for worker in bodies for p, _ in worker)
    routed = sum("/generate" in line and "finished processing" in line for line in router.log_tail(10**7).splitlines())
    assert generated >= 16 and routed == generated  # every generation went through the router
