"""Sandbox pool benchmark: acquire latency (warm pool vs cold start) and exec round-trip, docker and bwrap.

    python benchmarks/sandbox_pool.py [--backends docker bwrap] [--n 30] [--images 8] [--think-s 1.0]
        [--out results.json]

With `--images K` (docker), a `MultiImagePool` serves episodes over K images (a skewed, seeded mix, 4 at
a time) with no warm spares and with a spares budget of K/2, side by side: acquire latency, start latency
and warm-hit rate with many images. Each of those episodes holds its sandbox for --think-s seconds (the agent
thinking; twice that in the GRPO groups).
The exec round-trip is compared with the engine's own path measured in the same run: the `docker exec`
CLI (and the docker SDK's `exec_run`) for docker, and a bare `bwrap ... true` for bwrap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from envhub.sandboxes import SandboxPool
from envhub.sandboxes.images import ensure_base_image, ensure_rootfs

if TYPE_CHECKING:
    from envhub.sandboxes.multipool import MultiImagePool


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000
    return {
        "p50_ms": round(pick(0.5), 2),
        "p99_ms": round(pick(0.99), 2),
        "mean_ms": round(statistics.mean(ordered) * 1000, 2),
        "n": len(ordered),
    }


async def _wait_for_spares(pool: SandboxPool | MultiImagePool, count: int, deadline_s: float = float("inf")) -> None:
    """Until `count` spares are warm in `pool` (across its images for a MultiImagePool), or `deadline_s` passed
    (the hit rate then shows the misses)."""
    until = time.monotonic() + deadline_s
    while pool.metrics().spares < count and time.monotonic() < until:
        await asyncio.sleep(0.02)


async def _acquire_latencies(backend: str, n: int, *, size: int, health_interval: float = 30.0) -> list[float]:
    samples = []
    async with SandboxPool(backend=backend, size=size, max_size=2, health_interval=health_interval) as pool:
        for _ in range(n):
            await _wait_for_spares(pool, pool.size)
            started = time.perf_counter()
            async with pool.acquire() as sb:
                samples.append(time.perf_counter() - started)
                await sb.exec("true", timeout=30)  # the sandbox really works
    return samples


async def _exec_latencies(backend: str, n: int) -> tuple[list[float], list[float], str]:
    async with SandboxPool(backend=backend, size=1, max_size=1) as pool:
        async with pool.acquire() as sb:
            ours = []
            for _ in range(n):
                started = time.perf_counter()
                await sb.exec("true", timeout=30)
                ours.append(time.perf_counter() - started)
            if backend == "docker":
                argv = ["docker", "exec", "-u", "1000:1000", sb.container_id, "sh", "-c", "true"]
                reference = "docker exec CLI"
            else:
                argv = sb._launcher() + sb._argv(["sh", "-c", "true"], "/workspace", {})
                reference = "bare bwrap"
            theirs = []
            for _ in range(n):
                started = time.perf_counter()
                subprocess.run(argv, check=True, capture_output=True)
                theirs.append(time.perf_counter() - started)
    return ours, theirs, reference


def _sdk_exec_latencies(n: int) -> list[float]:
    from envhub.sandboxes.docker_backend import shared_client

    container = shared_client().containers.run(
        ensure_base_image(),
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        labels={"envhub.sandbox": "1", "envhub.owner_pid": "0"},
    )
    try:
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            container.exec_run(["sh", "-c", "true"], user="1000:1000")
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        container.remove(force=True)


async def _many_images(tags: list[str], episodes: int, budget: int, think_s: float) -> dict:
    import random

    from envhub.sandboxes.multipool import MultiImagePool

    rng = random.Random(0)
    weights = [1 / (rank + 1) for rank in range(len(tags))]  # a few images are popular, most are rare
    order = rng.choices(tags, weights=weights, k=episodes)
    async with MultiImagePool("docker", spares_budget=budget, spares_per_image=1, max_in_use=8) as pools:
        gate = asyncio.Semaphore(4)

        async def episode(tag: str) -> None:
            async with gate:
                async with pools.acquire(tag) as sb:
                    await sb.exec("true", timeout=30)
                    await asyncio.sleep(think_s)  # the agent thinking

        started = time.perf_counter()
        await asyncio.gather(*(episode(tag) for tag in order))
        wall = time.perf_counter() - started
        m = pools.metrics()
    return {
        "images": len(tags),
        "episodes": episodes,
        "spares_budget": budget,
        "hit_rate": round(m.hit_rate, 3),
        "acquire_p50_ms": round(m.acquire_p50_ms, 1),
        "acquire_p99_ms": round(m.acquire_p99_ms, 1),
        "start_p50_ms": round(m.start_p50_ms, 1),
        "start_p99_ms": round(m.start_p99_ms, 1),
        "evictions": m.evictions,
        "episodes_per_s": round(episodes / wall, 2),
    }


async def _grpo_groups(tags: list[str], group_size: int, prewarm: bool, think_s: float) -> dict:
    """GRPO's pattern: each group runs `group_size` episodes of one instance (image) at once; with `prewarm`,
    the next group's image gets `group_size` spares while the current group runs."""
    from envhub.sandboxes.multipool import MultiImagePool

    async with MultiImagePool(
        "docker", spares_budget=group_size if prewarm else 0, spares_per_image=0, max_in_use=2 * group_size
    ) as pools:
        if prewarm:
            await pools.prewarm(tags[0], count=group_size)
            await _wait_for_spares(pools, group_size, 120.0)  # the first group's, as if warmed while the model loads

        async def episode(tag: str) -> None:
            async with pools.acquire(tag) as sb:
                await sb.exec("true", timeout=30)
                await asyncio.sleep(2 * think_s)  # the agent thinking

        started = time.perf_counter()
        for index, tag in enumerate(tags):
            group = [asyncio.ensure_future(episode(tag)) for _ in range(group_size)]
            await asyncio.sleep(0.1)  # the group has taken its sandboxes
            if prewarm and index + 1 < len(tags):
                await pools.prewarm(tags[index + 1], count=group_size)
            await asyncio.gather(*group)
        wall = time.perf_counter() - started
        m = pools.metrics()
    return {
        "groups": len(tags),
        "group_size": group_size,
        "prewarm": prewarm,
        "hit_rate": round(m.hit_rate, 3),
        "acquire_p50_ms": round(m.acquire_p50_ms, 1),
        "acquire_p99_ms": round(m.acquire_p99_ms, 1),
        "start_p50_ms": round(m.start_p50_ms, 1),
        "wall_s": round(wall, 2),
    }


def _image_tags(k: int) -> list[str]:
    from envhub.sandboxes.docker_backend import shared_client

    base = shared_client().images.get(ensure_base_image())
    tags = [f"envhub-bench/image-{i}:1" for i in range(k)]
    for tag in tags:  # K names for one image: K pools, as K SWE instances would have
        base.tag(*tag.rsplit(":", 1))
    return tags


async def run(backends: list[str], n: int, images: int = 0, think_s: float = 1.0) -> dict:
    results: dict = {}
    if images and "docker" in backends:
        tags = await asyncio.to_thread(_image_tags, images)
        try:
            episodes = max(n, 3 * images)
            cold = await _many_images(tags, episodes, 0, think_s)
            warm = await _many_images(tags, episodes, max(images // 2, 1), think_s)
            results["docker_many_images"] = {
                "no_spares": cold,
                "lru_spares": warm,
                "acquire_p50_ratio": round(cold["acquire_p50_ms"] / max(warm["acquire_p50_ms"], 1e-3), 1),
            }
            groups = tags[: min(len(tags), 4)]
            cold_groups = await _grpo_groups(groups, 2, prewarm=False, think_s=think_s)
            warm_groups = await _grpo_groups(groups, 2, prewarm=True, think_s=think_s)
            results["docker_grpo_groups"] = {
                "cold": cold_groups,
                "prewarmed": warm_groups,
                "wall_ratio": round(cold_groups["wall_s"] / max(warm_groups["wall_s"], 1e-3), 2),
            }
        finally:
            from envhub.sandboxes.docker_backend import shared_client

            for tag in tags:
                shared_client().images.remove(tag)
    for backend in backends:
        row = {
            "warm_acquire": _summary(await _acquire_latencies(backend, n, size=1)),
            "warm_acquire_health_checked": _summary(await _acquire_latencies(backend, n, size=1, health_interval=0)),
            "cold_start": _summary(await _acquire_latencies(backend, max(n // 3, 5), size=0)),
        }
        ours, theirs, reference = await _exec_latencies(backend, n)
        row["exec_roundtrip"] = _summary(ours)
        row["reference_exec"] = {**_summary(theirs), "what": reference}
        if backend == "docker":
            row["docker_sdk_exec_run"] = _summary(await asyncio.to_thread(_sdk_exec_latencies, n))
        row["cold_over_warm"] = round(row["cold_start"]["p50_ms"] / max(row["warm_acquire"]["p50_ms"], 1e-3), 1)
        row["exec_over_reference"] = round(row["exec_roundtrip"]["p50_ms"] / row["reference_exec"]["p50_ms"], 2)
        results[backend] = row
    return results


def print_table(results: dict) -> None:
    """One line per backend and measurement: p50 / p99 in milliseconds."""
    many = results.get("docker_many_images")
    if many:
        for name in ("no_spares", "lru_spares"):
            r = many[name]
            print(
                f"docker   {r['images']} images, spares budget {r['spares_budget']:>2}: hit rate {r['hit_rate']:.2f}, "
                f"acquire p50 {r['acquire_p50_ms']} ms "
                f"p99 {r['acquire_p99_ms']} ms, start p50 {r['start_p50_ms']} ms, {r['episodes_per_s']} episodes/s, "
                f"{r['evictions']} evictions"
            )
    grpo = results.get("docker_grpo_groups")
    if grpo:
        for name in ("cold", "prewarmed"):
            r = grpo[name]
            print(
                f"docker   GRPO groups ({r['groups']} images x {r['group_size']} episodes), {name:<9}: hit rate "
                f"{r['hit_rate']:.2f}, "
                f"acquire p50 {r['acquire_p50_ms']} ms p99 {r['acquire_p99_ms']} ms, wall {r['wall_s']} s"
            )
    print(f"{'backend':<8} {'measurement':<30} {'p50 ms':>9} {'p99 ms':>9} {'n':>4}")
    for backend, row in results.items():
        if backend.startswith("docker_") and backend != "docker":
            continue
        for name, stats in row.items():
            if isinstance(stats, dict):
                label = name if "what" not in stats else f"{name} ({stats['what']})"
                print(f"{backend:<8} {label:<30} {stats['p50_ms']:>9.2f} {stats['p99_ms']:>9.2f} {stats['n']:>4}")
        print(
            f"{backend:<8} cold start / warm acquire (p50): {row['cold_over_warm']}x;  exec / reference (p50): "
            f"{row['exec_over_reference']}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["docker", "bwrap"], choices=["docker", "bwrap", "local"])
    parser.add_argument("--n", type=int, default=30, help="samples per measurement")
    parser.add_argument("--images", type=int, default=0, help="also measure a pool over this many images (docker)")
    parser.add_argument(
        "--think-s", type=float, default=1.0, help="seconds each many-images episode holds its sandbox (GRPO: twice)"
    )
    parser.add_argument("--out", default="benchmarks/results/sandbox_pool.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    if "docker" in args.backends:
        ensure_base_image()
    if "bwrap" in args.backends:
        ensure_rootfs(build=False)
    results = asyncio.run(run(args.backends, args.n, args.images, args.think_s))
    print_table(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "sandbox_pool",
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "results": results,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
