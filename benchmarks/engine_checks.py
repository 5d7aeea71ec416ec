"""Exactness and bandwidth figures for `benchmarks/engines.py`: the engine against a plain transformers forward."""

from __future__ import annotations

import time
from typing import Any

import torch

from envhub.inference import SamplingParams
from envhub.trainer.models import load_model


def memory_read_gbps(megabytes: int = 256, repeats: int = 5) -> float:
    """Best-of read bandwidth of this CPU (a sum over a buffer much larger than its caches), GB/s."""
    buffer = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * 4 / best / 1e9


def teacher_forced_logits(model: Any, prompt: list[int], output: list[int]) -> torch.Tensor:
    """float32 logits predicting each output token, from one forward pass over prompt + output."""
    ids = torch.tensor([prompt + output], device=model.device)
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return logits.float().cpu()


def greedy_agreement(logits: torch.Tensor, output: list[int], tie_margin: float) -> dict[str, int]:
    """Positions where the engine's greedy token is the reference argmax; a differing token counts as a tie when
    the reference's own top two logits are within `tie_margin` (rounding decides those)."""
    top2 = logits.topk(2, dim=-1)
    argmax = top2.indices[:, 0]
    tokens = torch.tensor(output)
    differ = argmax != tokens
    ties = differ & ((top2.values[:, 0] - top2.values[:, 1]) <= tie_margin)
    return {
        "positions": len(output),
        "equal": int((~differ).sum()),
        "ties": int(ties.sum()),
        "wrong": int((differ & ~ties).sum()),
    }


async def exactness(engine: Any, model_name: str, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
    """Greedy tokens vs a transformers forward in the engine's dtype and in fp32, and the engine's sampled
    logprobs vs fp32 log_softmax (KL(engine || fp32) estimated on its own samples, and over the full vocabulary
    between the engine-dtype and fp32 forwards)."""
    served_dtype = next(engine.model.parameters()).dtype
    fp32, _ = load_model(model_name, device="cpu", dtype=torch.float32)
    same_dtype = fp32 if served_dtype == torch.float32 else load_model(model_name, device="cpu", dtype=served_dtype)[0]
    greedy = SamplingParams(max_new_tokens=min(new_tokens, 32), temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=0)
    report: dict[str, Any] = {"served_dtype": str(served_dtype).removeprefix("torch.")}
    for label, reference, margin in (("greedy_vs_same_dtype", same_dtype, 0.1), ("greedy_vs_fp32", fp32, 0.1)):
        totals = {"positions": 0, "equal": 0, "ties": 0, "wrong": 0}
        for prompt in prompts:
            result = await engine.generate(prompt, greedy)
            counts = greedy_agreement(
                teacher_forced_logits(reference, prompt, result.output_ids), result.output_ids, margin
            )
            totals = {k: totals[k] + counts[k] for k in totals}
        report[label] = totals
    diffs, kls = [], []
    for prompt in prompts:
        result = await engine.generate(prompt, sampled)
        reference = torch.log_softmax(teacher_forced_logits(fp32, prompt, result.output_ids), dim=-1)
        served = torch.log_softmax(teacher_forced_logits(same_dtype, prompt, result.output_ids), dim=-1)
        chosen = reference.gather(1, torch.tensor(result.output_ids)[:, None])[:, 0]
        diffs.append(torch.tensor(result.logprobs) - chosen)
        kls.append((served.exp() * (served - reference)).sum(-1))
    diff = torch.cat(diffs)
    report["logprob_minus_fp32"] = {
        "tokens": int(diff.numel()),
        "mean": round(float(diff.mean()), 5),  # = a sample estimate of KL(engine || fp32)
        "mean_abs": round(float(diff.abs().mean()), 5),
        "max_abs": round(float(diff.abs().max()), 5),
    }
    report["kl_engine_fp32_sampled"] = round(float(diff.mean()), 5)
    report["kl_full_vocab_served_dtype_vs_fp32"] = round(float(torch.cat(kls).mean()), 6)
    return report
