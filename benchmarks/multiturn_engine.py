"""Multi-turn episodes on the embedded engine with and without prefix KV reuse, side by side in one run.

    python benchmarks/multiturn_engine.py [--model smollm2|tiny] [--envs SWE-v0 WebShop-v0 Sokoban-v0 Math-v0]
        [--episodes 2] [--turns 3] [--max-new-tokens 48] [--out benchmarks/results/multiturn_engine.json]

Real episodes (RolloutWorker, greedy, so both modes play the same tokens) of the agentic envs, all in flight at
once on one EmbeddedEngine. Reports episodes/s, generated tokens/s and tokens prefilled for each mode, whether the
outputs were identical, and the speedup. An env that cannot run here (e.g. SWE-v0 without Docker) gets an error
entry and the rest still run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path

import torch

import envhub
from envhub.trainer.config import RolloutConfig
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.models import load_model
from envhub.trainer.rollout.worker import RolloutWorker


async def play(engine: EmbeddedEngine, tokenizer, envs: list[str], episodes: int, config: RolloutConfig) -> dict:
    """All episodes of all envs concurrently; returns timings, token counts and each episode's ids."""
    worker = RolloutWorker(engine, tokenizer, config)
    jobs = [(env_id, seed) for env_id in envs for seed in range(episodes)]
    started = time.perf_counter()
    results = await asyncio.gather(
        *[worker.run_episode(lambda e=env_id: envhub.make(e), env_id, seed) for env_id, seed in jobs],
        return_exceptions=True,
    )
    seconds = time.perf_counter() - started
    done = [r for r in results if not isinstance(r, BaseException)]
    errors = {
        env_id: f"{type(r).__name__}: {r}" for (env_id, _), r in zip(jobs, results) if isinstance(r, BaseException)
    }
    generated = sum(t.num_model_tokens for t in done)
    return {
        "seconds": seconds,
        "episodes": len(done),
        "turns": sum(t.turns for t in done),
        "episodes_per_s": len(done) / seconds,
        "generated_tokens": generated,
        "generated_tokens_per_s": generated / seconds,
        "prefill_tokens": engine.stats.prefill_tokens,
        "reused_tokens": engine.stats.reused_tokens,
        "prompt_tokens_per_turn": sum(e["prompt_tokens"] for t in done for e in t.turn_log if e.get("kind") == "turn")
        / max(1, sum(t.turns for t in done)),
        "errors": errors,
        "_ids": {(t.task, t.seed): t.input_ids for t in done},
    }


async def main_async(args: argparse.Namespace) -> dict:
    model, tokenizer = load_model(args.model)
    config = RolloutConfig(
        group_size=2,
        max_turns=args.turns,
        max_new_tokens=args.max_new_tokens,
        max_total_tokens=8192,
        temperature=0.0,
        episode_timeout_s=1800,
    )
    modes = {"no_reuse": 0.0, "prefix_reuse": 512.0}
    report = {}
    for name, cache_mb in modes.items():
        engine = EmbeddedEngine(
            model, tokenizer, max_batch_size=64, prefix_cache_mb=cache_mb, prefill_chunk=args.prefill_chunk
        )
        try:
            report[name] = await play(engine, tokenizer, args.envs, args.episodes, config)
        finally:
            await engine.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--envs", nargs="+", default=["SWE-v0", "WebShop-v0", "Sokoban-v0", "Math-v0"])
    parser.add_argument("--episodes", type=int, default=2, help="episodes per env (all run concurrently)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prefill-chunk", type=int, default=512)
    parser.add_argument("--out", default="benchmarks/results/multiturn_engine.json")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    report = asyncio.run(main_async(args))
    a, b = report["no_reuse"], report["prefix_reuse"]
    same = sum(a["_ids"].get(k) == v for k, v in b["_ids"].items())
    print(
        f"model={args.model} envs={' '.join(args.envs)} episodes/env={args.episodes} turns<={args.turns} "
        f"max_new_tokens={args.max_new_tokens} threads={torch.get_num_threads()} load={load:.1f}"
    )
    print(
        f"{'mode':<14} {'episodes':>8} {'turns':>6} {'seconds':>8} {'episodes/s':>10} {'gen tok/s':>9} "
        f"{'prefilled':>9} {'reused':>7}"
    )
    for name, r in report.items():
        print(
            f"{name:<14} {r['episodes']:>8} {r['turns']:>6} {r['seconds']:>8.1f} {r['episodes_per_s']:>10.3f} "
            f"{r['generated_tokens_per_s']:>9.1f} {r['prefill_tokens']:>9} {r['reused_tokens']:>7}"
        )
    speedup = a["seconds"] / b["seconds"]
    print(f"speedup (episodes/s): {speedup:.2f}x   identical episodes: {same}/{len(b['_ids'])}")
    for name, r in report.items():
        for env_id, error in r["errors"].items():
            print(f"  {name}: {env_id} failed: {error[:160]}")
    for r in report.values():
        r.pop("_ids")
    out = {
        "model": args.model,
        "host": platform.node(),
        "cpu_threads": torch.get_num_threads(),
        "load_avg_1m": load,
        "gpu": "none available for this task" if not torch.cuda.is_available() else torch.cuda.get_device_name(),
        "envs": args.envs,
        "episodes_per_env": args.episodes,
        "turns": args.turns,
        "max_new_tokens": args.max_new_tokens,
        "prefill_chunk": args.prefill_chunk,
        **report,
        "speedup_episodes_per_s": speedup,
        "identical_episodes": same,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
