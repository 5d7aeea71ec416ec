"""Measure WebShop-v0 throughput: oracle episodes one at a time, then many concurrent sessions on one server.

Run: python -m envhub.envs.web.bench [--concurrency 64] [--episodes 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass

from envhub.envs.web.env import WebShopEnv


@dataclass(frozen=True)
class BenchResult:
    """Throughput of one run: episodes, steps, seconds, and the rates."""

    concurrency: int
    episodes: int
    steps: int
    seconds: float
    steps_per_s: float
    episodes_per_s: float
    mean_reward: float


async def _worker(env: WebShopEnv, seeds: list[int], totals: list[float]) -> None:
    for seed in seeds:
        await env.areset(seed=seed)
        reward = 0.0
        for action in env.oracle_actions():
            _, reward, _, _, _ = await env.astep(action)
            totals[1] += 1
        totals[0] += reward


async def run(concurrency: int, episodes: int, shop_url: str | None = None) -> BenchResult:
    """Play `episodes` oracle episodes with `concurrency` envs at once against one shared shop."""
    envs = [WebShopEnv(shop_url=shop_url) for _ in range(concurrency)]
    seeds = [list(range(i, episodes, concurrency)) for i in range(concurrency)]
    totals = [0.0, 0.0]  # reward sum, steps
    await envs[0].areset(seed=0)  # start the server and build the catalogue outside the timing
    start = time.perf_counter()
    try:
        await asyncio.gather(*(_worker(env, s, totals) for env, s in zip(envs, seeds)))
    finally:
        seconds = time.perf_counter() - start
        await asyncio.gather(*(env.aclose() for env in envs))
    steps = int(totals[1])
    return BenchResult(
        concurrency,
        episodes,
        steps,
        round(seconds, 3),
        round(steps / seconds, 1),
        round(episodes / seconds, 1),
        totals[0] / episodes,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m envhub.envs.web.bench")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument(
        "--shop-url", default=None, help="a shop started with `python -m envhub.envs.web.shop` (default: in-process)"
    )
    args = parser.parse_args()
    for concurrency in (1, args.concurrency):
        result = asyncio.run(run(concurrency, args.episodes, args.shop_url))
        print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()
