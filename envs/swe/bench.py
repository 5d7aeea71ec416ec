"""Measure SWE-v0: reset, one tool step, grading, and episodes/minute with N concurrent episodes.

    python -m envhub.envs.swe.bench --concurrency 8 --episodes 16 [--backend docker] [--json out.json]

Each episode is scripted: reset, view a file, apply the gold patch through the bash tool, run the
visible tests, submit (graded in a fresh sandbox). Every episode should get reward 1.0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import time
from typing import Any

from envhub.envs.swe.env import SWEEnv


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


async def scripted_episode(env: SWEEnv, index: int) -> dict[str, float]:
    """One solved episode; returns the seconds spent in reset, tool steps and the grading step."""
    t0 = time.perf_counter()
    await env.areset(options={"index": index})
    t1 = time.perf_counter()
    inst = env.instance
    assert inst is not None
    await env.astep(_call("view", path="README.md"))
    t2 = time.perf_counter()
    await env.astep(_call("bash", command=f"printf %s {shlex.quote(inst.patch)} | git apply"))
    await env.astep(_call("bash", command="python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -1"))
    t3 = time.perf_counter()
    _, reward, *_ = await env.astep(_call("submit"))
    t4 = time.perf_counter()
    return {
        "reset": t1 - t0,
        "view_step": t2 - t1,
        "test_step": (t3 - t2) / 2,
        "submit_grade": t4 - t3,
        "episode": t4 - t0,
        "reward": reward,
    }


async def run(concurrency: int, episodes: int, backend: str) -> dict[str, Any]:
    """Run `episodes` scripted episodes, `concurrency` at a time, on one shared pool."""
    from envhub.sandboxes import SandboxPool

    async with SandboxPool(backend=backend, size=min(concurrency, 8), max_size=2 * concurrency) as pool:
        await scripted_episode(SWEEnv(pool=pool), 0)  # warm caches (repo archives, image)
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> dict[str, float]:
            async with gate:
                env = SWEEnv(pool=pool)
                try:
                    return await scripted_episode(env, i)
                finally:
                    await env.aclose()

        started = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(episodes)))
        wall = time.perf_counter() - started
        metrics = pool.metrics()
    summary: dict[str, Any] = {
        key: round(statistics.median(r[key] for r in results), 3)
        for key in ("reset", "view_step", "test_step", "submit_grade", "episode")
    }
    summary.update(
        backend=backend,
        concurrency=concurrency,
        episodes=episodes,
        wall_seconds=round(wall, 2),
        episodes_per_minute=round(60 * episodes / wall, 1),
        mean_reward=sum(r["reward"] for r in results) / episodes,
        acquire_p50_ms=round(metrics.acquire_p50_ms, 1),
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--backend", default="docker", choices=("docker", "bwrap", "local"))
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()
    summary = asyncio.run(run(args.concurrency, args.episodes, args.backend))
    for key, value in summary.items():
        print(f"{key:>20}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
