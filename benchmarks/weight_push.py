"""Seconds to push new weights into an idle embedded EmbeddedEngine, the way the trainer pushes them.

    python benchmarks/weight_push.py [--model smollm2] [--dtype float32|bfloat16] [--repeats 5] [--label NAME]
        [--out benchmarks/results/weight_push.json]

The learner's fp32 state dict (tied weights once, as `named_parameters` gives them) goes to
`engine.update_weights` on an engine serving `--dtype`; reported: the median and min over `--repeats` pushes.
Written to run unchanged against older embedded engines too (it needs only `EmbeddedEngine(model, tokenizer)` and
`update_weights(state, version=)`), so a before/after figure is this script run from two checkouts; results append
to `--out` under `--label`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import torch

from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.models import load_model


async def push_seconds(model_name: str, dtype: torch.dtype, repeats: int) -> list[float]:
    served, tokenizer = load_model(model_name, device="cpu", dtype=dtype)
    learner, _ = load_model(model_name, device="cpu", dtype=torch.float32)
    state = {name: p.detach() for name, p in learner.named_parameters()}
    engine = EmbeddedEngine(served, tokenizer)
    times = []
    try:
        for version in range(1, repeats + 1):
            started = time.perf_counter()
            await engine.update_weights(state, version=version)
            times.append(time.perf_counter() - started)
    finally:
        await engine.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--label", default="current")
    parser.add_argument("--out", default="benchmarks/results/weight_push.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    times = asyncio.run(push_seconds(args.model, getattr(torch, args.dtype), args.repeats))
    row = {
        "label": args.label,
        "model": args.model,
        "served_dtype": args.dtype,
        "repeats": args.repeats,
        "push_s_median": round(statistics.median(times), 3),
        "push_s_min": round(min(times), 3),
        "torch_threads": torch.get_num_threads(),
        "load_average": round(os.getloadavg()[0], 2),
    }
    out = Path(args.out)
    rows = json.loads(out.read_text())["rows"] if out.exists() else []
    rows = [r for r in rows if (r["label"], r["served_dtype"]) != (args.label, args.dtype)] + [row]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"what": __doc__.splitlines()[0], "rows": rows}, indent=2))
    print(json.dumps(row))


if __name__ == "__main__":
    main()
