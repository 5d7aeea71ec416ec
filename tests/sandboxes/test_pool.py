"""SandboxPool: warm spares, back-pressure, clean hand-outs, health checks, orphan cleanup, metrics."""

import asyncio
import subprocess
import sys

import pytest

from envhub.cli.main import main as cli_main
from envhub.sandboxes import PoolMetrics, SandboxPool
from envhub.sandboxes.docker_backend import LABEL_OWNER, LABEL_SANDBOX, shared_client


@pytest.fixture(params=["docker", "bwrap"])
def pool(request):
    return request.getfixturevalue(f"{request.param}_pool")


async def test_warm_spares_then_refill(pool):
    assert pool.metrics().spares == 2
    async with pool.acquire() as sb:
        assert (await sb.exec("echo hi", timeout=10)).stdout == "hi\n"
    for _ in range(100):  # the pool refills in the background
        if pool.metrics().spares == 2 and pool.metrics().destroyed == 1:
            break
        await asyncio.sleep(0.05)
    m = pool.metrics()
    assert isinstance(m, PoolMetrics)
    assert (m.acquires, m.in_use, m.spares, m.cold_starts, m.failed, m.destroyed) == (1, 0, 2, 0, 0, 1)
    assert m.created == 3 and 0 < m.acquire_p50_ms <= m.acquire_p99_ms


async def test_next_user_sees_nothing_of_the_previous_episode(pool):
    async with pool.acquire() as first:
        await first.exec("echo secret > /workspace/s.txt; echo secret > /tmp/s.txt; (sleep 300 &) ; true", timeout=10)
    async with pool.acquire() as second:
        assert second is not first
        r = await second.exec(
            "ls -A /workspace /tmp; ps -eo args --no-headers | grep -c '[s]leep 300' || true", timeout=10
        )
    assert "s.txt" not in r.stdout
    assert r.stdout.strip().endswith("0")


async def test_back_pressure_at_max_size(pool):
    held = [pool.acquire() for _ in range(pool.max_size)]
    sandboxes = [await cm.__aenter__() for cm in held]
    assert pool.metrics().in_use == pool.max_size
    extra_cm = pool.acquire()
    waiter = asyncio.create_task(extra_cm.__aenter__())
    await asyncio.sleep(0.3)
    assert not waiter.done()  # blocked until someone releases
    await held[0].__aexit__(None, None, None)
    extra = await asyncio.wait_for(waiter, 30)
    assert extra not in sandboxes
    for cm in held[1:]:
        await cm.__aexit__(None, None, None)
    assert pool.metrics().in_use == 1
    await extra_cm.__aexit__(None, None, None)
    assert pool.metrics().in_use == 0


async def test_unhealthy_spare_is_replaced(base_image):
    async with SandboxPool(backend="docker", image=base_image, size=1, health_interval=0) as pool:
        spare = pool._spares._queue[0][1]
        await asyncio.to_thread(shared_client().api.kill, spare.container_id)
        async with pool.acquire() as sb:
            assert sb is not spare
            assert (await sb.exec("echo ok", timeout=10)).stdout == "ok\n"
        assert pool.metrics().unhealthy == 1


CRASHING_OWNER = """
import asyncio, os, sys
from envhub.sandboxes import SandboxPool
async def main():
    docker = SandboxPool(backend="docker", size=2)
    bwrap = SandboxPool(backend="bwrap", size=1)
    await docker.start(); await bwrap.start()
    print("ready", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


async def test_gc_and_pool_start_remove_orphans_of_a_crashed_process(base_image, base_rootfs, capsys):
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_OWNER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    owner = str(proc.pid)
    proc.kill()  # SIGKILL: no cleanup code runs
    proc.wait()
    client = shared_client()
    orphans = lambda: client.api.containers(all=True, filters={"label": [LABEL_SANDBOX, f"{LABEL_OWNER}={owner}"]})
    assert len(orphans()) == 2
    from envhub.sandboxes.bwrap_backend import sandboxes_dir

    assert any(p.name.startswith(owner + "-") for p in sandboxes_dir().iterdir())
    assert cli_main(["sandbox", "gc"]) == 0
    assert "removed" in capsys.readouterr().out
    assert orphans() == []
    assert not any(p.name.startswith(owner + "-") for p in sandboxes_dir().iterdir())


def started_orphans(image: str, count: int) -> tuple[int, list[str]]:
    """`count` running sandbox containers whose owner process is dead; returns (that pid, their ids).

    The owner lives until every container has started: another xdist worker's pool removes orphans whenever it
    starts, and a container created for a pid already dead could be taken between its create and its start (Docker
    then refuses the start: "marked for removal").
    """
    owner = subprocess.Popen(["sleep", "infinity"])
    try:
        ids = [
            shared_client()
            .containers.run(
                image,
                ["sleep", "infinity"],
                detach=True,
                network_mode="none",
                labels={LABEL_SANDBOX: "1", LABEL_OWNER: str(owner.pid)},
            )
            .id
            for _ in range(count)
        ]
    finally:
        owner.kill()
        owner.wait()
    return owner.pid, ids


async def test_pool_start_removes_orphans(base_image):
    _, (container_id,) = started_orphans(base_image, 1)
    async with SandboxPool(backend="docker", image=base_image, size=0, max_size=1):
        pass
    # a pool starting on another worker at the same moment may be the one removing it (Docker then answers this
    # pool's removal with 409, removal in progress): start waits for that removal, so the container is gone now
    assert not shared_client().api.containers(all=True, filters={"id": container_id})


def test_concurrent_orphan_removals_each_return_only_when_the_orphans_are_gone(base_image):
    from concurrent.futures import ThreadPoolExecutor

    from envhub.sandboxes.docker_backend import remove_orphans

    owner, ids = started_orphans(base_image, 4)

    def remove_then_list() -> tuple[list[str], list]:
        removed = remove_orphans()
        return removed, shared_client().api.containers(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})

    with ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(lambda _: remove_then_list(), range(3)))
    for _removed, left in outcomes:
        assert left == []  # none of the three returned while a removal it raced was still under way
    names = [name for removed, _ in outcomes for name in removed]
    assert len(set(names)) == len(names)  # each container is reported by the one call that removed it
    assert not shared_client().api.containers(all=True, filters={"id": ids[0]})


async def test_missing_image_is_a_clear_error(base_image):
    from envhub.errors import SandboxError

    with pytest.raises(SandboxError, match="missing") as info:
        async with SandboxPool(backend="docker", image="envhub/base:does-not-exist", size=1):
            pass
    assert "envhub sandbox build" in str(info.value)


UNCLOSED_OWNER = """
import asyncio
from envhub.sandboxes import SandboxPool
async def main():
    for backend in ("docker", "bwrap"):
        await SandboxPool(backend=backend, size=1).start()  # never closed
asyncio.run(main())
"""


def test_unclosed_pool_cleans_up_at_exit(base_image, base_rootfs):
    from envhub.sandboxes.bwrap_backend import sandboxes_dir

    proc = subprocess.Popen([sys.executable, "-c", UNCLOSED_OWNER], stderr=subprocess.PIPE, text=True)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    left = shared_client().api.containers(all=True, filters={"label": [LABEL_SANDBOX, f"{LABEL_OWNER}={proc.pid}"]})
    assert left == []
    assert not any(p.name.startswith(f"{proc.pid}-") for p in sandboxes_dir().iterdir())
