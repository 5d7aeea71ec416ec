"""Resident memory of the EmbeddedEngine over a long multi-turn run: it must stay flat, not grow with time.

    python benchmarks/engine_memory.py [--model smollm2] [--minutes 10] [--episodes 16] [--turns 4]
        [--new-tokens 48] [--kv-cache-mb 512] [--out benchmarks/results/engine_memory.json]

`--episodes` conversations run at once, each `--turns` turns long (the whole conversation is resent every turn,
with a random "observation" of 20-200 tokens appended, so the prefix cache and the KV cache see ever-changing
lengths); finished episodes are replaced until the time is up. Every 5 seconds the process RSS, the KV cache's
allocated bytes and the prefix cache's bytes are written to the series; the summary compares the median RSS of
the second minute with that of the last minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import psutil
import torch

from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.models import load_model


async def episode(engine: EmbeddedEngine, rng: random.Random, turns: int, new_tokens: int) -> int:
    """One conversation of `turns` turns; returns the tokens generated."""
    ids = [rng.randrange(100, 40000) for _ in range(rng.randrange(50, 400))]
    generated = 0
    for _ in range(turns):
        sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
        result = await engine.generate(ids, sampling)
        generated += len(result.output_ids)
        ids += result.output_ids + [rng.randrange(100, 40000) for _ in range(rng.randrange(20, 200))]
    return generated


async def run(args: argparse.Namespace) -> dict:
    model, tokenizer = load_model(args.model, device="cpu", dtype=None)
    engine = EmbeddedEngine(
        model, tokenizer, dtype=args.dtype, max_batch_size=args.episodes, kv_cache_mb=args.kv_cache_mb
    )
    process, rng = psutil.Process(), random.Random(0)
    deadline = time.monotonic() + args.minutes * 60
    tokens = 0
    series: list[dict] = []

    async def worker() -> None:
        nonlocal tokens
        while time.monotonic() < deadline:
            tokens += await episode(engine, rng, args.turns, args.new_tokens)

    async def sampler() -> None:
        started = time.monotonic()
        while time.monotonic() < deadline:
            series.append(
                {
                    "t_s": round(time.monotonic() - started, 1),
                    "rss_mb": round(process.memory_info().rss / 2**20, 1),
                    "kv_cache_mb": round(engine.cache.bytes / 2**20, 1),
                    "prefix_cache_mb": round(engine.prefix_cache.bytes / 2**20, 1),
                    "tokens": tokens,
                }
            )
            await asyncio.sleep(5)

    try:
        await asyncio.gather(sampler(), *[worker() for _ in range(args.episodes)])
    finally:
        await engine.close()
    second_minute = [p["rss_mb"] for p in series if 60 <= p["t_s"] < 120]
    last_minute = [p["rss_mb"] for p in series if p["t_s"] >= series[-1]["t_s"] - 60]
    return {
        "model": args.model,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "minutes": args.minutes,
        "episodes": args.episodes,
        "turns": args.turns,
        "tokens": tokens,
        "rss_mb_second_minute": statistics.median(second_minute) if second_minute else None,
        "rss_mb_last_minute": statistics.median(last_minute),
        "rss_mb_max": max(p["rss_mb"] for p in series),
        "kv_cache_mb_max": max(p["kv_cache_mb"] for p in series),
        "prefix_cache_hits": engine.prefix_cache.stats.hits,
        "host": platform.node(),
        "load_average": os.getloadavg(),
        "series": series,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--kv-cache-mb", type=float, default=512.0)
    parser.add_argument("--out", default="benchmarks/results/engine_memory.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    report = asyncio.run(run(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "series"}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
