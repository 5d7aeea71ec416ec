"""Learner memory benchmark: peak memory and tokens/s of one GRPO step against trajectory length and batch mix.

    python benchmarks/learner_memory.py [--quick] [--out results.json]

Each case runs one learner step in a fresh subprocess (so the process's peak RSS belongs to that step)
on a tiny Llama (hidden 64, 2 layers, 8,192-token vocabulary, SDPA attention). Peak = max RSS during
the step minus RSS before it (CPU; glibc is told to mmap blocks over 128 KiB so that freed tensors leave
RSS), or torch.cuda.max_memory_allocated (GPU). Sweeps, measured side by
side in one run:
- length: one episode of 1k..32k tokens (a micro-batch holds it alone);
- mix: one 8k episode plus 0/8/16 episodes of 1k, 8k tokens per micro-batch (batch x longest grows 3x..17x);
- budget: the same 8 x 1k batch with 1k..8k tokens per micro-batch;
- checkpointing: a 16k episode with gradient checkpointing on;
plus the old layout (whole batch padded to its longest, all logits at once) on 8 x 1k.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VOCAB = 8192  # small enough for a 2-core CPU to run every case in minutes; the logits still dominate at 1k tokens


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident set size in MiB (Linux /proc): now (VmRSS) or its peak (VmHWM).

    The peak is VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child would start at its parent's peak.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measured_step(learner: Any, groups: list[list[Any]], device: Any) -> tuple[dict[str, float], float, float]:
    """One learner step: its stats, its seconds, and the peak MiB it held over what was held before it (torch's
    CUDA allocator on a GPU; the process's peak RSS, VmHWM, on the CPU)."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() / 2**20 if cuda else rss_mb()
    started = time.perf_counter()
    stats = learner.step(groups)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else rss_mb("VmHWM")
    return stats, elapsed, peak - base


def run_case(
    lengths: list[int], budget: int, chunk: int, checkpointing: bool = False, seed: int = 0
) -> dict[str, float]:
    """One learner step over episodes of `lengths` tokens (90% model tokens); runs in this process."""
    import random

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from envhub.trainer.config import AlgorithmConfig, LearnerConfig
    from envhub.trainer.learner.step import Learner
    from envhub.trainer.trajectory import Trajectory

    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(lengths) + 1,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).to(device)
    rng = random.Random(seed)
    trajs = []
    for i, n in enumerate(lengths):
        prompt = n // 10
        trajs.append(
            Trajectory(
                input_ids=[rng.randrange(VOCAB) for _ in range(n)],
                loss_mask=[0] * prompt + [1] * (n - prompt),
                behavior_logprobs=[0.0] * prompt + [-10.8] * (n - prompt),
                versions=[-1] * prompt + [0] * (n - prompt),
                reward=float(i % 2),
                task="bench",
                group_id="g",
                seed=0,
                turns=1,
                finish_reason="terminated",
            )
        )
    groups = [trajs[i : i + 2] for i in range(0, len(trajs), 2)]  # GRPO groups of 2 (a lone episode gets advantage 0)
    algo = AlgorithmConfig(max_tokens_per_micro_batch=budget, micro_batch_size=0, max_initial_kl=0.0)
    learner = Learner(
        model,
        algo,
        1.0,
        0,
        learner_config=LearnerConfig(logprob_chunk_tokens=chunk, gradient_checkpointing=checkpointing),
    )
    stats, elapsed, peak = measured_step(learner, groups, device)
    return {
        "device": device.type,
        "episodes": len(lengths),
        "longest": max(lengths),
        "tokens": sum(lengths),
        "batch_x_longest": len(lengths) * max(lengths),
        "budget": budget,
        "chunk": chunk,
        "checkpointing": checkpointing,
        "micro_batches": stats["micro_batches"],
        "padded_tokens": stats["padded_tokens"],
        "peak_mb": round(peak, 1),
        "step_s": round(elapsed, 2),
        "tokens_per_s": round(sum(lengths) / elapsed, 1),
    }


def cases(quick: bool) -> list[tuple[str, list[int], int, int, bool]]:
    """(sweep, lengths, tokens per micro-batch, logprob chunk, checkpointing) for every measured case."""
    k = 1024
    lengths = [1 * k, 4 * k, 8 * k] if quick else [1 * k, 4 * k, 16 * k, 32 * k]
    out = [("length", [n], 8 * k, 1024, False) for n in lengths]
    out += [("mix", [8 * k] + [k] * extra, 8 * k, 1024, False) for extra in (0, 8, 16)]
    out += [("budget", [k] * 8, budget, 1024, False) for budget in (1 * k, 2 * k, 8 * k)]
    out += [("checkpoint", [(4 if quick else 16) * k], 8 * k, 1024, True)]
    out += [("old layout", [k] * 8, 10**9, 10**9, False)]
    return out


def main(out: str | None = None, quick: bool = False) -> list[dict[str, float]]:
    """Run every case in its own subprocess; print a table and write JSON."""
    rows = []
    print(
        f"{'sweep':<11}{'episodes':>9}{'longest':>8}{'B x longest':>12}{'budget':>11}"
        f"{'micro':>6}{'padded':>8}{'peak MiB':>10}{'tok/s':>9}"
    )
    for sweep, lengths, budget, chunk, checkpointing in cases(quick):
        code = (
            f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import learner_memory as m; "
            f"print(json.dumps(m.run_case({lengths!r}, {budget}, {chunk}, {checkpointing})))"
        )
        # large blocks straight from mmap, so freed tensors leave RSS and the peak is what the step held at once
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            print(f"{sweep}: failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        row = {"sweep": sweep, **json.loads(done.stdout.strip().splitlines()[-1])}
        rows.append(row)
        print(
            f"{sweep:<11}{row['episodes']:>9}{row['longest']:>8}{row['batch_x_longest']:>12}{min(budget, 10**6):>11}"
            f"{int(row['micro_batches']):>6}{int(row['padded_tokens']):>8}{row['peak_mb']:>10}{row['tokens_per_s']:>9}"
        )
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="episodes up to 8k tokens only")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    main(args.out, args.quick)
