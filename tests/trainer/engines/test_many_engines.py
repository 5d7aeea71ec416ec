"""Rollouts spread over two real `envhub serve-engine` servers on 127.0.0.1 (least-loaded routing)."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.errors import EngineError
from envhub.inference import SamplingParams
from envhub.trainer.config import config_from_dict
from envhub.trainer.engines.routing import MultiEngine, http_engines
from envhub.trainer.train import Trainer
from tests.trainer.test_train_http_engine import free_port

pytest.importorskip("envhub.trainer.engines.sglang.client")
REPO = Path(__file__).resolve().parents[3]
# one xdist unit: the module's tests run in one go on one worker, so its module-scoped pair of servers is made once
# (handed out one by one, they interleave with other modules' tests and pytest tears it down between them)
pytestmark = pytest.mark.xdist_group("many-engines")


@pytest.fixture(scope="module")
def weights_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def _serve_two(weights_root):
    """Two serve-engine servers of the tiny model (the trainer's initial policy), stopped after the yield."""
    ports = [free_port(), free_port()]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "envhub.cli.main",
                "serve-engine",
                "--model",
                "tiny",
                "--port",
                str(p),
                "--device",
                "cpu",
                "--allow-weights-dir",
                str(weights_root),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in ports
    ]
    yield ",".join(f"http://127.0.0.1:{p}" for p in ports), procs
    for proc in procs:  # both stop at once: each takes a second or two to exit
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def two_servers(weights_root):
    yield from _serve_two(weights_root)


@pytest.fixture
def fresh_servers(weights_root):
    """Servers no earlier test has pushed weights to: a run's first step checks the engine serves its policy."""
    yield from _serve_two(weights_root)


async def wait_healthy(engine, procs):
    for _ in range(600):
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(proc.stderr.read())
        try:
            if await engine.health():
                return
        except Exception:
            pass
        await asyncio.sleep(0.2)
    pytest.fail("engine servers did not come up")


@pytest.mark.slow
async def test_requests_spread_over_both_servers(two_servers):
    urls, procs = two_servers
    engine = http_engines(urls)
    assert isinstance(engine, MultiEngine) and len(engine.engines) == 2
    await wait_healthy(engine, procs)
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    results = await asyncio.gather(*[engine.generate([1, 2, 3, 4 + i], sampling) for i in range(12)])
    served = [r.meta["engine"] for r in results]
    assert served.count(0) >= 3 and served.count(1) >= 3  # both servers took a real share
    assert all(len(r.output_ids) == len(r.logprobs) > 0 for r in results)
    assert engine.load == [0, 0]
    await engine.close()


@pytest.mark.slow
async def test_training_pushes_weights_to_every_server(two_servers, weights_root):
    urls, procs = two_servers
    tmp_path = weights_root / "run"
    probe = http_engines(urls)
    await wait_healthy(probe, procs)
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "engine": {"kind": "sglang", "url": urls},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 4, "max_new_tokens": 4, "max_turns": 1},
            "algorithm": {"groups_per_step": 2, "lr": 0.01, "mode": "sync"},
            "budget": {"steps": 2, "checkpoint_every": 10},
            "out_dir": str(tmp_path),
        }
    )
    result = await Trainer(config).run()
    assert result.last_step == 2
    assert [await e.get_weight_version() for e in probe.engines] == [2, 2]
    await probe.close()


def test_engine_urls_make_one_client_or_a_least_loaded_multi_engine():
    sglang_engine = pytest.importorskip("envhub.trainer.engines.sglang.client")
    assert isinstance(http_engines("http://127.0.0.1:30000"), sglang_engine.SGLangEngine)
    multi = http_engines("http://a:1, http://b:2,")
    assert [e.url for e in multi.engines] == ["http://a:1", "http://b:2"]
    with pytest.raises(EngineError, match="no engine URL"):
        http_engines(" , ")


@pytest.mark.slow
async def test_training_broadcasts_weights_to_every_server_over_one_group(fresh_servers, weights_root):
    """engine.weight_sync nccl (gloo here): one process group, the trainer rank 0 and each server at its rank
    offset (1 and 2), formed at the first push; every push is one broadcast all servers receive."""
    urls, procs = fresh_servers
    probe = http_engines(urls)
    await wait_healthy(probe, procs)
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "engine": {"kind": "sglang", "url": urls, "weight_sync": "nccl", "group_backend": "gloo", "bucket_mb": 0.1},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 4, "max_new_tokens": 4, "max_turns": 1},
            "algorithm": {"groups_per_step": 2, "lr": 0.01, "mode": "sync"},
            "budget": {"steps": 2, "checkpoint_every": 10},
            "out_dir": str(weights_root / "nccl-run"),
        }
    )
    result = await Trainer(config).run()
    assert result.last_step == 2
    assert [await e.get_weight_version() for e in probe.engines] == [2, 2]
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    outputs = [(await e.generate([1, 2, 3], greedy)).output_ids for e in probe.engines]
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine

    trained = EmbeddedEngine.from_pretrained(str(result.checkpoint), device="cpu")
    assert outputs == [(await trained.generate([1, 2, 3], greedy)).output_ids] * 2  # the trained weights, on both
    await trained.close()
    await probe.close()
