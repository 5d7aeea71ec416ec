"""Where a EmbeddedEngine decode step spends its time: the torch ops of steady-state decode steps, grouped.

    python benchmarks/engine_profile.py [--model smollm2] [--dtype auto] [--sequences 32] [--prompt-tokens 256]
        [--steps 16] [--threads 1] [--no-pack] [--mmap-threshold 65536,2097152]
        [--out benchmarks/results/engine_profile.json]

The engine prefills `--sequences` random prompts and decodes a few tokens; then it is paused in place (the batch and
its KV stay) and `--steps` decode steps run in this thread under torch.profiler. Reported: wall ms per step, and
self CPU ms per step by group (projection matmuls, LM head, attention, norms/rotary/elementwise, sampling, KV writes,
the rest), plus the top ops, and the minor page faults per unprofiled step.

`--mmap-threshold` sets glibc's mmap threshold (bytes) in place of the engine's own (`hardware.
fix_malloc_mmap_threshold`). With several values, each runs in its own process (the setting is per process), one
after another in the order given, and the report keeps each beside the others with each step time's ratio to the
first value's: the A/B behind the engine's default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded import engine as engine_module
from envhub.trainer.engines.embedded import hardware
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.models import load_model

GROUPS = {
    "sampling": ("sampling",),
    "lm_head": ("lm_head",),
    "attention (sdpa, or the native decode kernel)": (
        "scaled_dot_product",
        "_flash_attention",
        "flash_attention",
        "decode_attention",
    ),
    "kv writes (index_copy_)": ("index_copy", "index_put"),
    "matmuls (q/k/v/o, mlp)": (
        "aten::addmm",
        "aten::mm",
        "aten::linear",
        "aten::matmul",
        "aten::bmm",
        "mkldnn::_linear_pointwise",
    ),
    "elementwise (norm, rotary, silu, add)": (
        "aten::mul",
        "aten::add",
        "aten::silu",
        "aten::pow",
        "aten::mean",
        "aten::rsqrt",
        "aten::cat",
        "aten::neg",
        "aten::cos",
        "aten::sin",
        "aten::copy_",
        "aten::to",
        "aten::_to_copy",
    ),
}


def group_of(name: str) -> str:
    for group, keys in GROUPS.items():
        if any(key in name for key in keys):
            return group
    return "other"


async def prepared_engine(args: argparse.Namespace) -> EmbeddedEngine:
    model, tokenizer = load_model(args.model, device="cpu", dtype=torch.float32)
    engine = EmbeddedEngine(
        model, tokenizer, dtype=args.dtype, max_batch_size=args.sequences, pack_weights=False if args.no_pack else None
    )
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(args.prompt_tokens)] for _ in range(args.sequences)]
    params = SamplingParams(max_new_tokens=10_000 // 10, temperature=1.0, ignore_eos=True)
    tasks = [asyncio.ensure_future(engine.generate(p, params)) for p in prompts]
    while engine.stats.decode_steps < 4:
        await asyncio.sleep(0.05)
    await engine.pause("in_place")
    for task in tasks:
        task.cancel()  # the engine aborts them on close; the batch stays put until then
    return engine


def profile_steps(engine: EmbeddedEngine, steps: int) -> dict:
    original = engine_module.sample_next

    def labelled_sampling(*a, **k):
        with record_function("sampling"):
            return original(*a, **k)

    projections = engine.runner.projections
    head = projections.head

    def labelled_head(x):
        with record_function("lm_head"):
            return head(x)

    runner, kernel = engine.runner, engine.runner.decode_kernel

    def labelled_attention(*a, **k):  # a ctypes call: the profiler sees no torch op in it
        with record_function("decode_attention"):
            return kernel(*a, **k)

    engine_module.sample_next, projections.head = labelled_sampling, labelled_head
    if kernel is not None:
        runner.decode_kernel = labelled_attention
    try:
        engine._step()  # warm
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        for _ in range(steps):
            engine._step()
        plain_ms = (time.perf_counter() - started) / steps * 1e3
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                engine._step()
    finally:
        engine_module.sample_next, projections.head, runner.decode_kernel = original, head, kernel
    events = prof.key_averages()
    labelled = {e.key: e.cpu_time_total / steps / 1e3 for e in events if e.key in ("sampling", "lm_head")}
    groups: dict[str, float] = defaultdict(float)
    for event in events:
        if event.key in ("sampling", "lm_head"):
            continue
        groups[group_of(event.key)] += event.self_cpu_time_total / steps / 1e3
    # ops under the labelled ranges were counted by op name too: move the labels' totals out of their ops' groups
    groups["matmuls (q/k/v/o, mlp)"] -= labelled.get("lm_head", 0.0)
    for name, ms in labelled.items():
        groups[name] += ms
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return {
        "step_ms_unprofiled": round(plain_ms, 2),
        "minor_page_faults_per_step": round(faults / steps),
        "rows": engine.num_running,
        "self_cpu_ms_per_step": {k: round(v, 2) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_ops_ms_per_step": {e.key: round(e.self_cpu_time_total / steps / 1e3, 2) for e in top},
    }


async def run(args: argparse.Namespace) -> dict:
    engine = await prepared_engine(args)
    try:
        with torch.inference_mode():
            return {"dtype": str(next(engine.model.parameters()).dtype), **profile_steps(engine, args.steps)}
    finally:
        await engine.close()


def thresholds(text: str) -> list[int]:
    """`--mmap-threshold`: comma-separated byte counts, each at least 4 KiB."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of byte counts; write e.g. 65536,2097152") from None
    if not values or any(v < 4096 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more thresholds of at least 4096 bytes")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} names a threshold twice; run again for a second sample")
    return values


def compare_thresholds(argv: list[str], values: list[int]) -> dict:
    """Each threshold in a fresh process of this script, in the order given; step times side by side."""
    keep = []  # this run's arguments less --mmap-threshold and --out, which each child gets its own of
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--mmap-threshold", "--out"):
            skip = True
        elif not arg.startswith(("--mmap-threshold=", "--out=")):
            keep.append(arg)
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for value in values:
            out = Path(scratch) / f"{value}.json"
            command = [sys.executable, __file__, *keep, "--mmap-threshold", str(value), "--out", str(out)]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            runs[str(value)] = json.loads(out.read_text())
    first = runs[str(values[0])]["step_ms_unprofiled"]
    return {
        "mmap_thresholds": values,
        "step_ms_unprofiled": {k: r["step_ms_unprofiled"] for k, r in runs.items()},
        "minor_page_faults_per_step": {k: r["minor_page_faults_per_step"] for k, r in runs.items()},
        "step_ms_ratio_to_first": {k: round(r["step_ms_unprofiled"] / first, 3) for k, r in runs.items()},
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-pack", action="store_true", help="the model's own linear modules (no packed weights)")
    parser.add_argument(
        "--mmap-threshold", type=thresholds, help="glibc's mmap threshold in bytes; several: one process each"
    )
    parser.add_argument("--out", default="benchmarks/results/engine_profile.json")
    args = parser.parse_args()
    if args.mmap_threshold is not None and len(args.mmap_threshold) > 1:
        report = {"load_average": os.getloadavg(), **compare_thresholds(sys.argv[1:], args.mmap_threshold)}
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))
        return
    if args.mmap_threshold is not None:  # the engine applies its own on construction: this one instead
        threshold = args.mmap_threshold[0]
        engine_module.fix_malloc_mmap_threshold = lambda: hardware.fix_malloc_mmap_threshold(threshold)
    torch.set_num_threads(args.threads)
    report = {
        "threads": args.threads,
        "mmap_threshold": args.mmap_threshold and args.mmap_threshold[0],
        "load_average": os.getloadavg(),
        **asyncio.run(run(args)),
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
