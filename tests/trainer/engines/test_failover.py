"""Several servers that may die (`watched_engines`): two real `envhub serve-engine` servers on 127.0.0.1, one killed
and restarted. Requests fail over to the live server, pushes reach every server that answers (a restarted one gets
the latest weights before it serves again), a server that stays away is lost, and the run stops only when all are."""

import asyncio
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.inference import SamplingParams
from envhub.trainer.engines import watch
from envhub.trainer.engines.protocol import episode_key
from envhub.trainer.engines.routing import http_engines, watched_engines
from envhub.trainer.engines.watch import EngineDown
from tests.trainer.test_train_http_engine import free_port

pytest.importorskip("envhub.trainer.engines.sglang.client")
REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow
SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0)


class Servers:
    """serve-engine processes of the tiny model, each on a fixed port, so one can be killed and started again."""

    def __init__(self, weights_dir: Path, count: int = 2):
        self.weights_dir = weights_dir
        self.ports = [free_port() for _ in range(count)]
        self.procs: list[subprocess.Popen | None] = [self._start(p) for p in self.ports]
        self.urls = ",".join(f"http://127.0.0.1:{p}" for p in self.ports)

    def _start(self, port: int) -> subprocess.Popen:
        command = [sys.executable, "-m", "envhub.cli.main", "serve-engine", "--model", "tiny", "--device", "cpu"]
        command += ["--port", str(port), "--allow-weights-dir", str(self.weights_dir)]
        return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self, index: int) -> None:
        proc = self.procs[index]
        proc.kill()
        proc.wait(timeout=30)

    def restart(self, index: int) -> None:
        self.procs[index] = self._start(self.ports[index])

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture
def servers(tmp_path):
    running = Servers(tmp_path)
    yield running
    running.stop()


async def until(condition, what: str, timeout: float = 120.0) -> None:
    """Poll `condition()` (a bool, or an awaitable of one) until it holds."""
    for _ in range(int(timeout / 0.2)):
        held = condition()
        if await held if inspect.isawaitable(held) else held:
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


async def generate(engine, episode: str):
    token = episode_key.set(episode)
    try:
        return await engine.generate([1, 2, 3, 4], SAMPLING)
    finally:
        episode_key.reset(token)


async def test_a_dead_server_fails_over_rejoins_with_the_latest_weights_or_is_lost(
    servers, tokenizer, tmp_path, monkeypatch
):
    from envhub.trainer.models import tiny_llama

    # the recovery's wait between polls doubles up to 10 s: the restarted server (up in 5-10 s) could stay unseen
    # that much longer; polling at least once a second finds it as soon as it answers
    monkeypatch.setattr(watch, "MAX_BACKOFF_S", 1.0)

    probes = http_engines(servers.urls).engines
    await until(lambda: _all_healthy(probes), "both servers")
    # clients that do not retry: each call and health check on a dead server would first spend the client's own
    # retries (0.4 + 0.8 + 1.6 s) before it counts as down; the trainer rides those out in test_engine_outage.py
    retries = 0
    multi = watched_engines(http_engines(servers.urls, retries=retries).engines, max_outage_s=120)  # no probe: the
    first = [await generate(multi, f"ep{i}") for i in range(4)]  # dead server is found by the request sent to it
    assert sorted(r.meta["engine"] for r in first) == [0, 0, 1, 1]
    on_second = next(f"ep{i}" for i, r in enumerate(first) if r.meta["engine"] == 1)

    servers.kill(1)
    again = await generate(multi, on_second)  # its episode stuck to the dead server: resubmitted on the other
    assert again.meta["engine"] == 0 and multi.failovers == 1 and not multi.engines[1].available
    assert {(await generate(multi, f"new{i}")).meta["engine"] for i in range(4)} == {0}

    weights = tmp_path / "v1"
    tiny_llama(tokenizer, seed=1).save_pretrained(weights)
    await multi.update_weights(str(weights), version=1)  # the live server loads it, the dead one gets it when back
    assert await probes[0].get_weight_version() == 1

    servers.restart(1)
    await until(lambda: multi.engines[1].available, "the restarted server to rejoin")
    assert await probes[1].get_weight_version() == 1  # pushed again before it served anything
    assert {(await generate(multi, f"late{i}")).meta["engine"] for i in range(4)} == {0, 1}
    assert multi.metrics()["engine_outages"] == 1 and multi.metrics()["engines_lost"] == 0
    await multi.close()

    # the same servers, a run that waits 1 s for a server: one that stays away is lost, the run goes on until both are
    multi = watched_engines(http_engines(servers.urls, retries=retries).engines, max_outage_s=1.0)
    multi.start_watch()
    servers.kill(1)
    await until(lambda: multi.engines[1].lost, "the dead server to be lost", timeout=30)
    multi.raise_if_failed()  # one server still serves: the run goes on
    assert await multi.health() and {(await generate(multi, f"ep{i}")).meta["engine"] for i in range(4)} == {0}
    assert multi.metrics()["engines_lost"] == 1

    servers.kill(0)
    with pytest.raises(EngineDown, match="was not back within 1 s"):
        await asyncio.wait_for(generate(multi, "last"), timeout=60)
    assert multi.metrics()["engines_lost"] == 2 and not await multi.health()
    with pytest.raises(EngineDown):
        multi.raise_if_failed()
    await multi.close()
    for probe in probes:
        await probe.close()


async def _all_healthy(engines) -> bool:
    results = await asyncio.gather(*[e.health() for e in engines], return_exceptions=True)
    return all(r is True for r in results)
