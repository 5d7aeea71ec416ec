"""`MultiImagePool`: warm spares per image under one budget, LRU eviction, one global bound, clear errors."""

import asyncio
import os

import pytest

from envhub.errors import SandboxError
from envhub.sandboxes.multipool import MultiImagePool

# names of this process's own: parallel workers each tag and remove theirs
TAGS = [f"envhub-test/multipool-{name}:{os.getpid()}" for name in "abc"]


@pytest.fixture(scope="module")
def images(base_image):
    from envhub.sandboxes.images import docker_client

    client = docker_client()
    for tag in TAGS:  # three names for the base image: three pools, no build needed
        repository, version = tag.rsplit(":", 1)
        client.images.get(base_image).tag(repository, version)
    yield TAGS
    for tag in TAGS:
        client.images.remove(tag)


async def test_lru_eviction_keeps_the_budget_and_hits_warm_spares(images):
    async with MultiImagePool("docker", spares_budget=2, spares_per_image=1, max_in_use=4) as pools:
        for tag in images:  # a, b, c: the third image's spare evicts a's (least recently used)
            async with pools.acquire(tag) as sandbox:
                assert (await sandbox.exec("echo ok", timeout=10)).stdout.strip() == "ok"
        assert pools.spares_by_image() == {images[0]: 0, images[1]: 1, images[2]: 1}
        assert pools.metrics().evictions == 1
        await asyncio.sleep(0)
        for _ in range(50):  # wait for b's spare to be started in the background
            if pools._pools[(images[1], None)].metrics().spares:
                break
            await asyncio.sleep(0.1)
        before = pools.metrics()
        async with pools.acquire(images[1]):
            pass
        after = pools.metrics()
        assert after.hits == before.hits + 1 and after.cold_starts == before.cold_starts  # b was warm
        assert 0 < after.hit_rate < 1 and after.start_p50_ms > 0


async def test_one_global_bound_across_images(images):
    async with MultiImagePool("docker", spares_budget=0, max_in_use=1) as pools:
        running, peak = 0, 0

        async def use(tag):
            nonlocal running, peak
            async with pools.acquire(tag):
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(0.05)
                running -= 1

        await asyncio.gather(*(use(tag) for tag in images))
        assert peak == 1 and pools.metrics().acquires == 3


async def test_missing_image_names_it_and_how_to_load_it(base_image):
    async with MultiImagePool("docker") as pools:
        with pytest.raises(SandboxError) as err:
            async with pools.acquire("envhub-test/not-here:404"):
                pass
    assert "envhub-test/not-here:404" in str(err.value) and "docker load" in str(err.value)


async def test_image_layout_runs_as_root_without_capabilities(base_image):
    """Images that carry their own repo are edited in place: writable root, uid 0, yet no capabilities,
    no network, and nothing survives into the next sandbox."""
    from envhub.sandboxes.base import ImageLayout

    async with MultiImagePool("docker", spares_budget=0) as pools:
        layout = ImageLayout(path_prefix=("/opt/envhub-test/bin",))
        async with pools.acquire(base_image, layout) as sb:
            r = await sb.exec(
                "id -u; grep CapEff /proc/self/status; echo $PATH; touch /usr/envhub-was-here && echo wrote", timeout=20
            )
            assert r.stdout.split()[0] == "0" and "CapEff:\t0000000000000000" in r.stdout
            assert r.stdout.splitlines()[2].startswith("/opt/envhub-test/bin:") and "wrote" in r.stdout
            denied = await sb.exec("touch /tmp/f && chown 1:1 /tmp/f", timeout=20)
            assert denied.exit_code != 0  # CAP_CHOWN dropped
            offline = await sb.exec(
                "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"", timeout=20
            )
            assert offline.exit_code != 0
        async with pools.acquire(base_image, layout) as sb:
            assert (await sb.exec("test -e /usr/envhub-was-here", timeout=20)).exit_code == 1  # a fresh container


async def test_prewarm_makes_the_next_acquires_warm(images):
    async with MultiImagePool("docker", spares_budget=3, spares_per_image=1) as pools:
        await pools.prewarm(images[0], count=2)  # e.g. the next GRPO group of two episodes
        for _ in range(100):
            if pools._pools[(images[0], None)].metrics().spares == 2:
                break
            await asyncio.sleep(0.1)
        async with pools.acquire(images[0]), pools.acquire(images[0]):
            pass
        assert pools.metrics().hits == 2 and pools.metrics().cold_starts == 0
