"""The dry-run's learner arithmetic against a measured peak: one learner step on a random SmolLM2-135M-shaped model.

    python benchmarks/placement_check.py [--tokens 2048] [--out benchmarks/results/placement_check.json]

Each case (bf16 autocast, bf16 with gradient checkpointing, fp32) runs in a fresh subprocess: two episodes of
tokens/2 (90% model tokens) in one micro-batch, the learner's first step. Peak = max RSS during the step minus RSS
before it (glibc told to mmap blocks over 128 KiB, so freed tensors leave RSS), or torch.cuda.max_memory_allocated
on a GPU. On a first step of one micro-batch the Adam states appear only after backward, when the activations are
gone, so the peak is what the step holds during forward/backward: `trainer/placement/memory.py`'s activations +
the larger of the logits chunk and the recomputed layer + the autocast weight casts (the logits chunk counted on the
model tokens only); the table prints both and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from learner_memory import measured_step  # the benchmark folder is not a package

CASES = (("bf16", True, False), ("bf16 + checkpointing", True, True), ("fp32", False, False))


def run_case(tokens: int, bf16: bool, checkpointing: bool) -> dict[str, float]:
    """One learner step in this process; returns the measured peak in MiB and the step's seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from envhub.trainer.config import AlgorithmConfig, LearnerConfig
    from envhub.trainer.learner.precision import Precision
    from envhub.trainer.learner.step import Learner
    from envhub.trainer.placement.shapes import KNOWN_SHAPES
    from envhub.trainer.trajectory import Trajectory

    shape = KNOWN_SHAPES["smollm2-135m"]
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, tie_word_embeddings=shape.tied_embeddings,
                         max_position_embeddings=8192, attn_implementation="sdpa")  # fmt: skip
    model = LlamaForCausalLM(config).to(device)
    rng, half = random.Random(0), tokens // 2
    prompt = half // 10
    mask = [0] * prompt + [1] * (half - prompt)
    trajs = [
        Trajectory(input_ids=[rng.randrange(shape.vocab) for _ in range(half)], loss_mask=mask,
                   behavior_logprobs=[0.0 if m == 0 else -10.8 for m in mask], versions=[m - 1 for m in mask],
                   reward=float(i), task="check", group_id="g", seed=0, turns=1, finish_reason="terminated")
        for i in range(2)
    ]  # fmt: skip
    dtype = torch.bfloat16 if bf16 else torch.float32
    algo = AlgorithmConfig(max_tokens_per_micro_batch=tokens, micro_batch_size=0, max_initial_kl=0.0)
    learner_config = LearnerConfig(logprob_chunk_tokens=2048, gradient_checkpointing=checkpointing)
    learner = Learner(model, algo, 1.0, 0, precision=Precision(device, dtype, dtype), learner_config=learner_config)
    _, elapsed, peak = measured_step(learner, [trajs], device)
    return {"device": device.type, "peak_mib": round(peak, 1), "step_s": round(elapsed, 1),
            "model_tokens": 2 * (half - prompt)}  # fmt: skip


def predicted_mib(tokens: int, model_tokens: int, bf16: bool, checkpointing: bool) -> float:
    """What the dry-run's arithmetic says the same step holds during forward/backward."""
    from envhub.trainer.placement.memory import LOGITS_BYTES, LearnerSettings, learner_memory
    from envhub.trainer.placement.shapes import KNOWN_SHAPES

    shape = KNOWN_SHAPES["smollm2-135m"]
    settings = LearnerSettings(compute_bytes=2 if bf16 else 4, checkpointing=checkpointing,
                               micro_batch_tokens=tokens, logprob_chunk=2048)  # fmt: skip
    parts = learner_memory(shape, settings).parts
    logits = min(2048, model_tokens) * shape.vocab * LOGITS_BYTES
    held = parts["activations"] + max(logits, parts.get("recomputed layer", 0))
    return round((held + parts.get("bf16 weight casts (autocast)", 0)) / 2**20, 1)


def main(tokens: int, out: str | None) -> list[dict]:
    """Every case in its own subprocess; a table and JSON."""
    rows = []
    print(f"{'case':<22}{'measured MiB':>14}{'dry-run MiB':>13}{'ratio':>8}{'step s':>8}")
    for name, bf16, checkpointing in CASES:
        code = (
            f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import placement_check as m; "
            f"print(json.dumps(m.run_case({tokens}, {bf16}, {checkpointing})))"
        )
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            print(f"{name}: failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        row = {"case": name, "tokens": tokens, **json.loads(done.stdout.strip().splitlines()[-1])}
        row["predicted_mib"] = predicted_mib(tokens, row["model_tokens"], bf16, checkpointing)
        row["ratio"] = round(row["predicted_mib"] / row["peak_mib"], 2)
        rows.append(row)
        print(f"{name:<22}{row['peak_mib']:>14}{row['predicted_mib']:>13}{row['ratio']:>8}{row['step_s']:>8}")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="tokens in the one micro-batch")
    parser.add_argument("--out", default="benchmarks/results/placement_check.json")
    args = parser.parse_args()
    main(args.tokens, args.out)
