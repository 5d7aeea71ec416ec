"""32 episodes share a pool of 8 from one event loop, which never stalls on Docker or bwrap calls."""

import asyncio
import time

import pytest

from envhub.sandboxes import SandboxPool


async def _heartbeat(lags: list[float], stop: asyncio.Event, period: float = 0.01) -> None:
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(period)
        lags.append(time.perf_counter() - before - period)


async def _episode(pool: SandboxPool, index: int, peak: list[int]) -> str:
    async with pool.acquire() as sb:
        peak.append(pool.metrics().in_use)
        await sb.write_file("/workspace/id.txt", f"{index}\n")
        r = await sb.exec("python3 -c 'import sys; print(open(\"id.txt\").read().strip())'", timeout=60)
        return r.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_32_episodes_share_a_pool_of_8(backend, request):
    request.getfixturevalue("base_image" if backend == "docker" else "base_rootfs")
    lags: list[float] = []
    stop = asyncio.Event()
    async with SandboxPool(backend=backend, size=8, max_size=8) as pool:
        beat = asyncio.create_task(_heartbeat(lags, stop))
        peak: list[int] = []
        started = time.perf_counter()
        outputs = await asyncio.gather(*(_episode(pool, i, peak) for i in range(32)))
        elapsed = time.perf_counter() - started
        stop.set()
        await beat
        metrics = pool.metrics()
    assert outputs == [str(i) for i in range(32)]  # every episode saw only its own file
    assert max(peak) <= 8 and metrics.acquires == 32 and metrics.failed == 0
    print(f"{backend}: 32 episodes in {elapsed:.1f} s, heartbeat max lag {max(lags) * 1000:.0f} ms, {metrics}")
    assert max(lags) < 0.25, f"event loop stalled {max(lags) * 1000:.0f} ms"
