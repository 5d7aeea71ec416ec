"""Multi-turn prefill steps on the EmbeddedEngine's model runner: the projections on each step's real tokens
(packed, `ModelRunner.pack_prefill`) against rows padded to the step's longest piece (the way before).

    python benchmarks/engine_prefill.py [--model smollm2] [--dtype bfloat16] [--steps 24] [--rows 4]
        [--threads 2] [--seed 0] [--out benchmarks/results/engine_prefill.json]

A multi-turn engine prefills each row's new turn (the env's observation after the model's reply) on top of the
conversation it caches: pieces of different lengths in one step. Each step here gives `--rows` rows, whose caches
already hold 200-1,200 tokens, a piece of 20-250 tokens each, at most 512 tokens in all (the engine's CPU prefill
chunk). The same seeded steps run both ways, alternating step by step, each twice (the first pass warms up
oneDNN's primitives and is not counted); the rows' cache lengths are put back after each step so both ways see the
same caches. Reported: prefill tokens/s of each way, GEMM rows per real token, the ratio, and how far the two ways'
logits differ (the share of rows with the same greedy next token, the largest logit difference).

Under load, give `--threads 1`: at 2 threads beside another busy process torch's OpenMP waits make every op
several times slower for both ways alike (docs/engines.md, Sharing the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from envhub.trainer.engines.embedded.kv_cache import KVCache
from envhub.trainer.engines.embedded.model_runner import ModelRunner, kv_layout
from envhub.trainer.engines.embedded.shapes import projection_rows, round_up
from envhub.trainer.models import load_model

CHUNK = 512  # the engine's default prefill_chunk


def steps_of(rng: random.Random, steps: int, rows: int) -> list[list[int]]:
    """Each step's piece lengths: `rows` turns of 20-250 tokens, cut to CHUNK tokens in all."""
    plans = []
    for _ in range(steps):
        lengths, budget = [], CHUNK
        for _ in range(rows):
            if budget <= 0:
                break
            lengths.append(min(rng.randint(20, 250), budget))
            budget -= lengths[-1]
        plans.append(lengths)
    return plans


def padded_rows(lengths: list[int]) -> int:
    """GEMM rows of a step whose rows are padded to the longest piece (as `ModelRunner.prefill` pads them)."""
    return projection_rows(len(lengths) * round_up(max(lengths), 32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/engine_prefill.json")
    args = parser.parse_args()
    if args.steps < 1 or args.rows < 1:
        parser.error("--steps and --rows must be at least 1")
    torch.set_num_threads(args.threads)
    model, _ = load_model(args.model, device="cpu", dtype=getattr(torch, args.dtype))
    rng = random.Random(args.seed)
    cache = KVCache(kv_layout(model), 1 << 31, max_rows=args.rows, max_tokens=2048)
    cache.reserve(args.rows, 1500)
    for _ in range(args.rows):
        cache.add_row()
    runner = ModelRunner(model, cache)
    vocab = model.config.vocab_size
    history = [[rng.randrange(100, vocab) for _ in range(rng.randint(200, 1200))] for _ in range(args.rows)]
    plans = steps_of(rng, args.steps, args.rows)
    pieces = [[[rng.randrange(100, vocab) for _ in range(n)] for n in lengths] for lengths in plans]
    seconds = {"packed": 0.0, "padded": 0.0}
    same_tokens, max_diff = 0, 0.0
    with torch.inference_mode():
        for row, context in enumerate(history):  # each row's conversation so far, in the cache
            runner.prefill(row, [context], 0)
        held = list(cache.lengths)
        for counted in (False, True):
            for step in pieces:
                out = {}
                for way in ("packed", "padded"):
                    runner.pack_prefill = way == "packed"
                    started = time.perf_counter()
                    logits = runner.prefill(0, step, 0)
                    if counted:
                        seconds[way] += time.perf_counter() - started
                    out[way] = logits
                    cache.lengths[:] = held
                if counted:
                    same_tokens += int((out["packed"].argmax(-1) == out["padded"].argmax(-1)).sum())
                    max_diff = max(max_diff, float((out["packed"] - out["padded"]).abs().max()))
    tokens = sum(map(sum, plans))
    rows = {"packed": sum(projection_rows(sum(lengths)) for lengths in plans), "padded": sum(map(padded_rows, plans))}
    report = {
        "model": args.model,
        "dtype": args.dtype,
        "threads": args.threads,
        "steps": args.steps,
        "rows": args.rows,
        "seed": args.seed,
        "tokens": tokens,
        "tokens_per_s": {way: round(tokens / s, 1) for way, s in seconds.items()},
        "gemm_rows_per_token": {way: round(n / tokens, 3) for way, n in rows.items()},
        "packed_over_padded": round(seconds["padded"] / seconds["packed"], 3),
        # the projections' GEMMs run on other row counts, so bf16 sums may round apart: near-ties can flip
        "same_next_token_share": round(same_tokens / sum(map(len, plans)), 3),
        "max_abs_logit_diff": round(max_diff, 4),
        "load_average": os.getloadavg(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
