"""The real engine as the oracle for ours: vLLM (CPU build) vs the embedded EmbeddedEngine on the same weights.

    python benchmarks/vllm_agreement.py [--model smollm2|tiny|DIR] [--prompts 8] [--max-new-tokens 64]
                                        [--pushes 3] [--out benchmarks/results/vllm_agreement.json]

One run: start a managed vLLM server (timed), then on chat prompts built from real envs' first observations
(Math-v0, Sokoban-v0, Letters-v0, with their system prompts, through envhub's chat template):
- greedy: token ids of vLLM and EmbeddedEngine (identical prompts; where they diverge, the top-2 logit gap of a
  plain forward pass at that position says whether it was a near tie), and |logprob difference| on the
  common prefix, against each other and against the forward pass;
- sampled at T=1 and T=0.7: vLLM's reported logprobs against log_softmax(logits / T) of the forward pass;
- weight pushes (state dict -> /dev/shm -> reload_weights between pause and resume) while 8 requests generate;
- throughput: generated tokens/s of both engines on the same batch (default 32 sequences of 256 random prompt ids
  + 128 new tokens, T=1, EOS ignored, all submitted at once), one engine at a time.
`--only-throughput` skips the agreement and push sections. Writes JSON with every figure and the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import envhub
from envhub.chat_tokens import ChatTokens
from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.vllm.engine import VLLMEngine
from envhub.trainer.engines.vllm.weights import served_model_dir

ENVS = ("Math-v0", "Sokoban-v0", "Letters-v0")


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    """Envhub-templated first turns of real envs (seeds 0, 1, ...)."""
    prompts = []
    for i in range(count):
        env = envhub.make(ENVS[i % len(ENVS)])
        obs, info = env.reset(seed=i)
        env.close()
        system = [{"role": "system", "content": info["system_prompt"]}] if info.get("system_prompt") else []
        prompts.append(ChatTokens(tokenizer).add_messages(system + [{"role": "user", "content": obs}]))
    return prompts


def forward_logits(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()


def token_logprobs(logits: torch.Tensor, output: list[int], temperature: float = 1.0) -> list[float]:
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def diffs(a: list[float], b: list[float]) -> list[float]:
    return [abs(x - y) for x, y in zip(a, b)]


async def greedy_agreement(vllm: VLLMEngine, local: EmbeddedEngine, model, prompts, max_new: int) -> dict:
    sampling = SamplingParams(max_new_tokens=max_new, temperature=0.0)
    rows, vs_local, vs_forward = [], [], []
    for prompt in prompts:
        real, ours = await asyncio.gather(vllm.generate(prompt, sampling), local.generate(prompt, sampling))
        common = next((i for i, (x, y) in enumerate(zip(real.output_ids, ours.output_ids)) if x != y), None)
        same = common is None and real.output_ids == ours.output_ids
        n = min(len(real.output_ids), len(ours.output_ids)) if common is None else common
        logits = forward_logits(model, prompt, real.output_ids)
        vs_local += diffs(real.logprobs[:n], ours.logprobs[:n])
        vs_forward += diffs(real.logprobs, token_logprobs(logits, real.output_ids))
        row = {"prompt_tokens": len(prompt), "tokens": len(real.output_ids), "identical": same}
        if not same and common is not None:
            top2 = logits[common].topk(2).values
            row.update(first_difference=common, top2_gap_there=float(top2[0] - top2[1]))
        rows.append(row)
    return {
        "prompts_identical": sum(r["identical"] for r in rows),
        "prompts": len(rows),
        "max_abs_logprob_diff_vs_local": max(vs_local),
        "mean_abs_logprob_diff_vs_local": statistics.fmean(vs_local),
        "max_abs_logprob_diff_vs_forward": max(vs_forward),
        "rows": rows,
    }


async def sampled_agreement(vllm: VLLMEngine, model, prompts, max_new: int, temperature: float) -> dict:
    sampling = SamplingParams(max_new_tokens=max_new, temperature=temperature)
    results = await asyncio.gather(*[vllm.generate(p, sampling) for p in prompts])
    d: list[float] = []
    for prompt, result in zip(prompts, results):
        d += diffs(
            result.logprobs,
            token_logprobs(forward_logits(model, prompt, result.output_ids), result.output_ids, temperature),
        )
    return {
        "temperature": temperature,
        "tokens": len(d),
        "max_abs_logprob_diff": max(d),
        "mean_abs_logprob_diff": statistics.fmean(d),
    }


async def push_timings(vllm: VLLMEngine, model, prompts, pushes: int) -> list[dict]:
    """Push perturbed weights and back while 8 requests generate; the per-phase seconds of each push."""
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    shifted = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in base.items()}
    sampling = SamplingParams(max_new_tokens=512, temperature=1.0, ignore_eos=True)
    load = [asyncio.create_task(vllm.generate(prompts[i % len(prompts)], sampling)) for i in range(8)]
    await asyncio.sleep(2.0)
    for i in range(pushes):
        await vllm.update_weights(shifted if i % 2 == 0 else base, version=vllm.version + 1)
        await asyncio.sleep(1.0)
    if pushes % 2:
        await vllm.update_weights(base, version=vllm.version + 1)
    results = await asyncio.gather(*load)
    return [
        {**vars(t), "requests_resubmitted": sum(r.meta["resubmits"] > 0 for r in results)} for t in vllm.pushes[:pushes]
    ]


async def engine_throughput(engine, prompts: list[list[int]], new_tokens: int) -> dict:
    """Generated tokens per second with every prompt submitted at once."""
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    started = time.perf_counter()
    results = await asyncio.gather(*[engine.generate(p, sampling) for p in prompts])
    wall = time.perf_counter() - started
    generated = sum(len(r.output_ids) for r in results)
    return {"wall_s": wall, "generated_tokens": generated, "tokens_per_s": generated / wall}


async def throughput(vllm: VLLMEngine, local: EmbeddedEngine, vocab: int, args: argparse.Namespace) -> dict:
    """Both engines on one batch of random prompts (the same ids), vLLM first."""
    rng = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (args.prompt_tokens,), generator=rng).tolist() for _ in range(args.seqs)]
    vllm_side = await engine_throughput(vllm, prompts, args.new_tokens)
    local_side = await engine_throughput(local, prompts, args.new_tokens)
    return {
        "seqs": args.seqs,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "vllm": vllm_side,
        "local": local_side,
        "vllm_tokens_per_s": vllm_side["tokens_per_s"],
        "local_tokens_per_s": local_side["tokens_per_s"],
    }


async def main(args: argparse.Namespace) -> dict:
    model_dir = served_model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = chat_prompts(tokenizer, args.prompts)
    started = time.perf_counter()
    vllm = await VLLMEngine.launch(model_dir, dtype="float32", kv_cache_gib=args.kv_cache_gib)
    startup_s = time.perf_counter() - started
    local = EmbeddedEngine(model, tokenizer)
    try:
        report = {
            "model": args.model,
            "model_dir": str(model_dir),
            "dtype": "float32",
            "vllm_startup_s": startup_s,
        }
        if not args.only_throughput:
            report["greedy"] = await greedy_agreement(vllm, local, model, prompts, args.max_new_tokens)
            report["sampled"] = [
                await sampled_agreement(vllm, model, prompts, args.max_new_tokens, t) for t in (1.0, 0.7)
            ]
            report["pushes"] = await push_timings(vllm, model, prompts, args.pushes)
        if args.seqs:
            report["throughput"] = await throughput(vllm, local, len(tokenizer), args)
    finally:
        await local.close()
        await vllm.close()
    report["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average": os.getloadavg()}
    return report


def print_report(report: dict) -> None:
    print(f"vLLM ready in {report['vllm_startup_s']:.1f} s")
    if "throughput" in report:
        t = report["throughput"]
        print(
            f"throughput ({t['seqs']} x {t['prompt_tokens']} prompt + {t['new_tokens']} new): vLLM "
            f"{t['vllm_tokens_per_s']:.1f} tok/s, EmbeddedEngine {t['local_tokens_per_s']:.1f} tok/s"
        )
    if "greedy" not in report:
        return
    greedy = report["greedy"]
    print(
        f"greedy: {greedy['prompts_identical']}/{greedy['prompts']} prompts with identical ids; max |dlogprob| "
        f"vs EmbeddedEngine {greedy['max_abs_logprob_diff_vs_local']:.2e}, "
        f"vs forward {greedy['max_abs_logprob_diff_vs_forward']:.2e}"
    )
    for s in report["sampled"]:
        print(
            f"T={s['temperature']}: max |dlogprob| vs log_softmax(logits/T) {s['max_abs_logprob_diff']:.2e} "
            f"({s['tokens']} tokens)"
        )
    for p in report["pushes"]:
        print(
            f"push v{p['version']}: total {p['total_s']:.2f} s (write {p['write_s']:.2f}, "
            f"generation paused {p['paused_s']:.2f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--seqs", type=int, default=32, help="throughput batch (0: skip the throughput section)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--only-throughput", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/vllm_agreement.json")
    args = parser.parse_args()
    report = asyncio.run(main(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    print(f"wrote {args.out}")
