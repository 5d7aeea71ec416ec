"""EmbeddedEngine tokens/s vs a plain sequential `model.generate` loop on the same prompts (greedy, same model).

    python benchmarks/engine_throughput.py [--model smollm2|tiny|DIR] [--prompts 16] [--max-new-tokens 32]

Prints a table and writes JSON (default benchmarks/results/engine_throughput.json) with the speedup ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from pathlib import Path

import torch

from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.models import load_model

QUESTIONS = [
    "What is {a}+{b}?",
    "Write one sentence about the number {a}.",
    "Name {b} colours.",
    "Is {a} larger than {b}? Explain briefly.",
]


def make_prompts(tokenizer, count: int) -> list[list[int]]:
    """Chat-formatted questions of varied length."""
    prompts = []
    for i in range(count):
        text = QUESTIONS[i % len(QUESTIONS)].format(a=3 + i * 7, b=2 + i % 5)
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def sequential_generate(model, prompts: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], float]:
    """One `model.generate` call per prompt, greedy; returns outputs and seconds."""
    outputs, start = [], time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], device=model.device)
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
            )
            outputs.append(out[0, len(prompt) :].tolist())
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return outputs, time.perf_counter() - start


async def engine_generate(
    engine: EmbeddedEngine, prompts: list[list[int]], max_new_tokens: int, one_at_a_time: bool = False
) -> tuple[list[list[int]], float]:
    """All prompts submitted at once to the engine (or one after another); returns outputs and seconds."""
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    start = time.perf_counter()
    if one_at_a_time:
        results = [await engine.generate(p, sampling) for p in prompts]
    else:
        results = await asyncio.gather(*[engine.generate(p, sampling) for p in prompts])
    return [r.output_ids for r in results], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default=None)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", default="benchmarks/results/engine_throughput.json")
    args = parser.parse_args()

    model, tokenizer = load_model(args.model, device=args.device)
    prompts = make_prompts(tokenizer, args.prompts)
    engine = EmbeddedEngine(model, tokenizer, max_batch_size=max(64, args.prompts))
    sequential_generate(model, prompts[:1], 2)  # warm-up
    seq_out, seq_s = sequential_generate(model, prompts, args.max_new_tokens)

    async def timed() -> tuple[tuple[list[list[int]], float], tuple[list[list[int]], float]]:
        try:
            await engine_generate(engine, prompts[:2], 2)  # warm-up
            single = await engine_generate(engine, prompts, args.max_new_tokens, one_at_a_time=True)
            engine.stats = type(engine.stats)()
            return single, await engine_generate(engine, prompts, args.max_new_tokens)
        finally:
            await engine.close()

    (one_out, one_s), (eng_out, eng_s) = asyncio.run(timed())
    seq_tokens, one_tokens, eng_tokens = sum(map(len, seq_out)), sum(map(len, one_out)), sum(map(len, eng_out))
    same = sum(a == b for a, b in zip(seq_out, eng_out))
    rows = [
        ("model.generate, sequential", seq_tokens, seq_s, seq_tokens / seq_s),
        ("EmbeddedEngine, one at a time", one_tokens, one_s, one_tokens / one_s),
        ("EmbeddedEngine, batched", eng_tokens, eng_s, eng_tokens / eng_s),
    ]
    print(
        f"model={args.model} device={model.device} dtype={model.dtype} prompts={args.prompts} "
        f"max_new_tokens={args.max_new_tokens}"
    )
    print(f"{'method':<28} {'tokens':>7} {'seconds':>8} {'tokens/s':>9}")
    for name, tokens, seconds, rate in rows:
        print(f"{name:<28} {tokens:>7} {seconds:>8.2f} {rate:>9.1f}")
    ratio = rows[2][3] / rows[0][3]
    print(
        f"speedup: {ratio:.2f}x   identical greedy outputs: {same}/{len(prompts)}   mean decode batch: "
        f"{engine.stats.mean_batch:.1f}"
    )
    report = {
        "model": args.model,
        "device": str(model.device),
        "dtype": str(model.dtype),
        "host": platform.node(),
        "cpu_threads": torch.get_num_threads(),
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "sequential": {"tokens": seq_tokens, "seconds": seq_s, "tokens_per_s": rows[0][3]},
        "engine_one_at_a_time": {"tokens": one_tokens, "seconds": one_s, "tokens_per_s": rows[1][3]},
        "engine": {
            "tokens": eng_tokens,
            "seconds": eng_s,
            "tokens_per_s": rows[2][3],
            "mean_decode_batch": engine.stats.mean_batch,
        },
        "speedup": ratio,
        "identical_outputs": same,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
