"""The learner's speed on the demo's batch: trained tokens/s alone and beside generation, and the share of the CPU's
bf16 matmul peak that its step reaches.

    python benchmarks/learner_speed.py [--config configs/demo.yaml] [--steps 4] [--seed 0]
        [--splits 2:2,1:1] [--out benchmarks/results/learner_speed.json]

The batch is shaped like a demo step's: `groups_per_step` groups of `group_size` episodes (8), a group's episodes
sharing one prompt of 100-170 tokens (the demo's tasks' first prompts measure 95-170 with SmolLM2's template), then
`max_turns` turns of up to `max_new_tokens` model tokens, lengths drawn from a fixed seed (ids random: speed does not
depend on them). The learner is the trainer's (`Learner.from_config`: fp32 masters, bf16 autocast, the config's
`train_layers` and micro-batches). Each figure is the median of `--steps` steps after one warm-up step.

- alone: nothing else computes;
- beside generation: an embedded engine in the same process decodes 32 sequences without pause on its compute
  thread, as the engine does during async RL; `--splits L:E` sets the learner's and the engine's torch threads
  (`auto:auto`: the trainer's rule, `envhub.trainer.run.cores`); the engine's decode tokens/s during the learner's
  steps is reported next to the learner's.

The peak is measured, not taken from a data sheet: a 2048^3 bf16 matmul (and fp32 for comparison) on all cores.
FLOPs per step are counted as 2 x parameters x tokens for every forward matmul (decoder layers over all tokens, the
vocabulary projection over model tokens only, as the learner computes it) and twice that again for the backward of
the trained layers and the projection; attention's score matmuls are added as 4 x layers x hidden x length^2 / 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch


def matmul_tflops(dtype: torch.dtype, size: int = 2048, repeats: int = 5, device: str = "cpu") -> float:
    """Achieved TFLOP/s of a size^3 matmul in `dtype` on `device` (this thread's cores on the CPU), best of
    `repeats`."""
    a, b = torch.randn(size, size, device=device).to(dtype), torch.randn(size, size, device=device).to(dtype)
    wait = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b
    wait()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        wait()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e12


def demo_batch(config: Any, vocab: int, seed: int) -> list[list[Any]]:
    """Groups of trajectories shaped like a demo step's (see the module docstring)."""
    from envhub.trainer.trajectory import Trajectory

    rng = random.Random(seed)
    roll = config.rollout
    groups = []
    for g in range(config.algorithm.groups_per_step):
        group = []
        prompt = [rng.randrange(100, vocab) for _ in range(rng.randint(100, 170))]  # one per group, as in the demo
        for i in range(roll.group_size):
            ids = list(prompt)
            mask = [0] * len(ids)
            for _ in range(rng.randint(1, roll.max_turns)):
                new = rng.randint(8, roll.max_new_tokens)
                observation = rng.randint(20, 60)
                ids += [rng.randrange(100, vocab) for _ in range(new + observation)]
                mask += [1] * new + [0] * observation
            ids, mask = ids[: roll.max_total_tokens], mask[: roll.max_total_tokens]
            group.append(
                Trajectory(
                    input_ids=ids,
                    loss_mask=mask,
                    behavior_logprobs=[-2.0 if m else 0.0 for m in mask],
                    versions=[0 if m else -1 for m in mask],
                    reward=float((g + i) % 2),
                    task="bench",
                    group_id=f"g{g}",
                    seed=i,
                    turns=1,
                    finish_reason="terminated",
                )
            )
        groups.append(group)
    return groups


def step_flops(model: Any, groups: list[list[Any]], train_layers: int) -> float:
    """Matmul FLOPs of one learner step (see the module docstring)."""
    cfg = model.config
    layers, hidden = cfg.num_hidden_layers, cfg.hidden_size
    per_layer = sum(p.numel() for p in model.model.layers[0].parameters() if p.dim() == 2)
    trained = train_layers or layers
    flops = 0.0
    for t in (t for g in groups for t in g):
        n, model_tokens = len(t.input_ids), sum(t.loss_mask)
        attention = 4 * hidden * n * n / 2  # QK^T and AV, causal
        forward = layers * (2 * per_layer * n + attention) + 2 * cfg.vocab_size * hidden * model_tokens
        backward = 2 * (trained * (2 * per_layer * n + attention) + 2 * cfg.vocab_size * hidden * model_tokens)
        flops += forward + backward
    return flops


class Generation:
    """An embedded engine decoding without pause on its own thread's event loop (as during async RL)."""

    def __init__(self, model: Any, tokenizer: Any, sequences: int = 32) -> None:
        from envhub.trainer.engines.embedded import EmbeddedEngine

        self.engine = EmbeddedEngine(model, tokenizer, max_batch_size=sequences)
        self.sequences = sequences
        self.tokens = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        from envhub.inference import SamplingParams

        rng = random.Random(1)
        sampling = SamplingParams(max_new_tokens=64, temperature=1.0, ignore_eos=True)

        async def one() -> None:
            while not self._stop.is_set():
                result = await self.engine.generate([rng.randrange(100, 40000) for _ in range(128)], sampling)
                self.tokens += len(result.output_ids)

        await asyncio.gather(*(one() for _ in range(self.sequences)))
        await self.engine.close()

    def __enter__(self) -> Generation:
        self._thread.start()
        time.sleep(5.0)  # decoding at full batch before the learner starts
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def measure(step: Any, groups: list[list[Any]], steps: int, generation: Generation | None) -> dict[str, float]:
    """Median seconds of `steps` calls of `step(groups)` after a warm-up, each on a fresh thread as the trainer's
    `asyncio.to_thread` would run it; the engine's tokens/s meanwhile."""

    def call() -> None:
        thread = threading.Thread(target=step, args=(groups,))
        thread.start()
        thread.join()

    call()  # warm-up
    times, rates = [], []
    for _ in range(steps):
        tokens = generation.tokens if generation else 0
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
        if generation:
            rates.append((generation.tokens - tokens) / times[-1])
    step_s = statistics.median(times)
    out = {"step_s": round(step_s, 2), "step_s_all": [round(t, 2) for t in times]}
    if generation:
        out["engine_tokens_per_s"] = round(statistics.median(rates), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--splits", default="2:2,1:1,auto:auto", help="learner:engine torch threads beside generation (auto: the rule)"
    )
    parser.add_argument("--out", default="benchmarks/results/learner_speed.json")
    args = parser.parse_args()

    from envhub.trainer.config import load_config
    from envhub.trainer.engines.embedded.threads import threads_setting, usable_cores
    from envhub.trainer.learner.step import Learner
    from envhub.trainer.models import build_policy
    from envhub.trainer.run.cores import CoreShare

    config = load_config(args.config)
    config.algorithm.max_initial_kl = 0.0  # random ids: the behaviour logprobs are placeholders
    cores = usable_cores()
    peak = {"bf16": round(matmul_tflops(torch.bfloat16), 3), "fp32": round(matmul_tflops(torch.float32), 3)}
    model, tokenizer = build_policy(config.model, config.seed)
    learner = Learner.from_config(config, model, tokenizer, None)
    groups = demo_batch(config, model.config.vocab_size, args.seed)
    trajs = [t for g in groups for t in g]
    model_tokens = sum(sum(t.loss_mask) for t in trajs)
    all_tokens = sum(len(t.input_ids) for t in trajs)
    flops = step_flops(learner.hf_model(), groups, config.learner.train_layers)

    def figures(result: dict[str, float]) -> dict[str, float]:
        tflops = flops / result["step_s"] / 1e12
        return {
            **result,
            "trained_tokens_per_s": round(model_tokens / result["step_s"], 1),
            "tokens_per_s": round(all_tokens / result["step_s"], 1),
            "tflops": round(tflops, 3),
            "share_of_bf16_peak": round(tflops / peak["bf16"], 3),
        }

    report: dict[str, Any] = {
        "config": args.config,
        "batch": {"episodes": len(trajs), "model_tokens": model_tokens, "tokens": all_tokens},
        "step_tflop": round(flops / 1e12, 3),
        "peak_tflops": peak,
        "alone": figures(measure(learner.step, groups, args.steps, None)),
        "beside_generation": {},
    }
    print(json.dumps(report["alone"]), flush=True)
    from envhub.trainer.models import copy_as

    engine_model = copy_as(learner.hf_model(), torch.bfloat16).eval()
    for split in args.splits.split(","):
        learner_threads, engine_threads = split.split(":")
        with Generation(engine_model, tokenizer) as generation:
            if split == "auto:auto":  # the trainer's rule (envhub.trainer.run.cores)
                share = CoreShare(cores=cores)
                share.attach(generation.engine)
                step = share.learner_step(learner.step, generating=lambda: True)
            else:
                generation.engine.threads = threads_setting(int(engine_threads))

                def step(groups: Any, threads: int = int(learner_threads)) -> Any:
                    torch.set_num_threads(threads)
                    return learner.step(groups)

            result = figures(measure(step, groups, args.steps, generation))
        report["beside_generation"][split] = result
        print(split, json.dumps(result), flush=True)
    report["machine"] = {
        "host": platform.node(),
        "cores": cores,
        "load_average": os.getloadavg(),
        "amx": bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
