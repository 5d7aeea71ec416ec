"""Rollouts during weight pushes against serve-engine with SGLang's semantics: plain update vs pause/retract vs
in_place.

    python benchmarks/weight_sync.py [--model tiny|smollm2|DIR] [--clients 8] [--max-new-tokens 16]
                                     [--seconds 20] [--push-every 3] [--rounds 2]

One run, three modes side by side on the same server and prompts, alternating for `--rounds`. Clients loop `/generate`
while the pusher
loads a checkpoint with `/update_weights_from_disk` every few seconds. Plain: the update waits for every
request in flight and new requests queue behind it. retract / in_place: the client pauses generation,
updates, continues. Reports generation tokens/s, the longest `/generate` call and the longest push,
and writes JSON (default benchmarks/results/weight_sync.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
from pathlib import Path

from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.server.app import start_engine_server
from envhub.trainer.engines.sglang.client import SGLangEngine
from envhub.trainer.models import load_model

MODES = ("none", "retract", "in_place")


async def run_mode(url: str, mode: str, weights: Path, args: argparse.Namespace) -> dict:
    """Clients generate while weights are pushed every `push_every` seconds, for `seconds`."""
    client = SGLangEngine(url, pause_mode=mode)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, ignore_eos=True)
    stop = asyncio.Event()
    waits: list[float] = []
    pushes: list[float] = []
    tokens = 0

    async def rollouts(seed: int) -> None:
        nonlocal tokens
        i = 0
        while not stop.is_set():
            started = time.perf_counter()
            result = await client.generate([1, 2, 3 + seed, 4 + i % 50], sampling)
            waits.append(time.perf_counter() - started)
            tokens += len(result.output_ids)
            i += 1

    async def pusher() -> None:
        version = 0
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), args.push_every)
            except TimeoutError:
                version += 1
                started = time.perf_counter()
                await client.update_weights(str(weights), version=version)
                pushes.append(time.perf_counter() - started)

    started = time.perf_counter()
    tasks = [asyncio.create_task(rollouts(i)) for i in range(args.clients)] + [asyncio.create_task(pusher())]
    await asyncio.sleep(args.seconds)
    stop.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    await client.close()
    return {
        "mode": "plain (blocking update)" if mode == "none" else f"pause {mode}",
        "tokens_per_s": tokens / elapsed,
        "requests": len(waits),
        "pushes": len(pushes),
        "longest_generate_s": max(waits),
        "median_generate_s": sorted(waits)[len(waits) // 2],
        "longest_push_s": max(pushes) if pushes else 0.0,
        "seconds": elapsed,
    }


def _merge(runs: list[dict]) -> dict:
    """Rounds of one mode as one row: totals, worst cases, the median of medians."""
    seconds = sum(r["seconds"] for r in runs)
    return {
        "mode": runs[0]["mode"],
        "tokens_per_s": sum(r["tokens_per_s"] * r["seconds"] for r in runs) / seconds,
        "requests": sum(r["requests"] for r in runs),
        "pushes": sum(r["pushes"] for r in runs),
        "longest_generate_s": max(r["longest_generate_s"] for r in runs),
        "median_generate_s": sorted(r["median_generate_s"] for r in runs)[len(runs) // 2],
        "longest_push_s": max(r["longest_push_s"] for r in runs),
        "seconds": seconds,
        "rounds": len(runs),
    }


async def main(args: argparse.Namespace) -> dict:
    model, tokenizer = load_model(args.model, device="cpu")
    with tempfile.TemporaryDirectory() as root:
        weights = Path(root) / "policy"
        model.save_pretrained(weights, safe_serialization=True)
        server = await start_engine_server(EmbeddedEngine(model, tokenizer, max_batch_size=64), weights_dirs=[root])
        try:
            runs = [await run_mode(server.url, mode, weights, args) for _ in range(args.rounds) for mode in MODES]
            rows = [_merge([r for r in runs if r["mode"] == name]) for name in dict.fromkeys(r["mode"] for r in runs)]
        finally:
            await server.stop()
    plain = rows[0]
    for row in rows:
        row["throughput_vs_plain"] = row["tokens_per_s"] / plain["tokens_per_s"]
        row["longest_wait_vs_plain"] = row["longest_generate_s"] / plain["longest_generate_s"]
    return {
        "machine": platform.platform(),
        "model": args.model,
        "clients": args.clients,
        "max_new_tokens": args.max_new_tokens,
        "push_every_s": args.push_every,
        "seconds_per_round": args.seconds,
        "rows": rows,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--push-every", type=float, default=3.0)
    parser.add_argument(
        "--rounds", type=int, default=2, help="modes alternate this many times (fair under changing load)"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "weight_sync.json"))
    options = parser.parse_args()
    report = asyncio.run(main(options))
    print(
        f"{'mode':26} {'tok/s':>8} {'vs plain':>8} {'longest /generate':>18} {'median':>8} {'longest push':>13} "
        f"{'pushes':>6}"
    )
    for r in report["rows"]:
        print(
            f"{r['mode']:26} {r['tokens_per_s']:8.1f} {r['throughput_vs_plain']:8.2f} {r['longest_generate_s']:17.2f}s"
            f" {r['median_generate_s']:7.2f}s {r['longest_push_s']:12.2f}s {r['pushes']:6d}"
        )
    Path(options.out).parent.mkdir(parents=True, exist_ok=True)
    Path(options.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {options.out}")
