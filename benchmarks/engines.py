"""The embedded EmbeddedEngine and vLLM side by side: same model, same prompts, one run, through `InferenceEngine`.

    python benchmarks/engines.py [--engines embedded,vllm] [--model smollm2] [--sequences 32] [--prompt-tokens 256]
        [--new-tokens 128] [--repeats 3] [--device cpu|cuda] [--dtype auto] [--vllm-dtype bfloat16] [--load N]
        [--out benchmarks/results/engines.json]

Each repeat generates `--new-tokens` tokens (temperature 1, logprobs, EOS ignored) for every sequence, all
submitted at once, engines taking turns so machine load hits them alike; tokens/s is generated tokens over the
wall time of the whole batch (prefill included). Also measured: the seconds a weight push takes (the embedded engine
gets a state dict, as the trainer pushes it; vLLM reloads a safetensors directory), and for the embedded engine
the time split (prefill / decode), the bytes a decode step reads (weights + KV) against the memory bandwidth
(`--peak-gbps`, default: H100 3350 / H200 4800 on those GPUs, a measured read bandwidth on CPU), and exactness
(greedy tokens against a plain transformers forward, KL(engine || fp32) of the sampled tokens).

`--load N` measures each engine again while N CPU-bound processes run beside it (each a torch fp32 matmul loop at
torch's default threads, neither niced nor pinned: what a learner or a busy env does to an engine on a shared
machine), the same load for both engines: `*_loaded_tokens_per_s`, `*_loaded_over_quiet` and the load's own CPU
seconds per engine batch are reported next to the quiet figures. (`local_*` keys repeat the `embedded_*` ones under
the engine's former name.)

`--engines embedded,embedded-unpacked` is the A/B of the embedded engine's packed weights (docs/engines.md, "Packed
projections"): the same engine on the model's own linear modules. `--engines embedded,embedded-sdpa` is the A/B of
its CPU decode-attention kernel (docs/engines.md, "Decode attention"): the same engine on SDPA.

On a GPU the lead runs: `python benchmarks/engines.py --engines embedded --device cuda --sequences 64
--prompt-tokens 1024 --new-tokens 256`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from envhub.inference import InferenceEngine, SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.embedded.hardware import engine_dtype
from envhub.trainer.engines.embedded.projections import PackedProjections
from envhub.trainer.engines.kinds import engine_kind
from envhub.trainer.models import load_model, pick_device, resolve_model_path

sys.path.insert(0, str(Path(__file__).parent))
from engine_checks import exactness, memory_read_gbps

GPU_PEAK_GBPS = {"H100": 3350.0, "H200": 4800.0}


def make_prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    """Random token ids (the lab's workload: ids in [100, 40000))."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(count)]


async def build_embedded(
    args: argparse.Namespace, unpacked: bool = False, sdpa: bool = False
) -> tuple[InferenceEngine, dict[str, Any]]:
    device = pick_device(args.device)
    dtype = engine_dtype(args.dtype, device)
    model, tokenizer = load_model(args.model, device=str(device), dtype=dtype)
    engine = EmbeddedEngine(
        model,
        tokenizer,
        max_batch_size=max(args.sequences, 1),
        prefill_chunk=args.prefill_chunk if args.prefill_chunk >= 0 else (8192 if device.type == "cuda" else 512),
        kv_cache_mb=args.kv_cache_mb,
        threads=args.threads if args.threads == "auto" else int(args.threads),
        pack_weights=False if unpacked else None,
        native_decode=False if sdpa else None,
    )
    packed = isinstance(engine.runner.projections, PackedProjections)
    return engine, {
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "threads": args.threads,
        "packed_weights": packed,
        "decode_attention": "native" if engine.runner.decode_kernel is not None else "sdpa",
    }


async def build_vllm(args: argparse.Namespace) -> tuple[InferenceEngine, dict[str, Any]]:
    model_dir = resolve_model_path(args.model)
    from envhub.trainer.engines.vllm.engine import VLLMEngine  # the trainer's own client: `make vllm` builds its venv

    started = time.perf_counter()
    engine = await VLLMEngine.launch(
        model_dir, dtype=args.vllm_dtype, max_model_len=args.prompt_tokens + args.new_tokens + 64
    )
    return engine, {"dtype": args.vllm_dtype, "startup_s": round(time.perf_counter() - started, 1)}


async def build_embedded_unpacked(args: argparse.Namespace) -> tuple[InferenceEngine, dict[str, Any]]:
    """The embedded engine on the model's own linear modules (no oneDNN-packed weights): the packing's A/B."""
    return await build_embedded(args, unpacked=True)


async def build_embedded_sdpa(args: argparse.Namespace) -> tuple[InferenceEngine, dict[str, Any]]:
    """The embedded engine with SDPA's decode attention instead of its C kernel: the kernel's A/B."""
    return await build_embedded(args, sdpa=True)


# engine kinds by name, and the embedded engine without packed weights or without its decode-attention kernel
BUILDERS = {
    "embedded": build_embedded,
    "vllm": build_vllm,
    "embedded-unpacked": build_embedded_unpacked,
    "embedded-sdpa": build_embedded_sdpa,
}
LOAD_SCRIPT = "import torch\nx = torch.randn(1024, 1024)\nwhile True:\n    x @ x\n"  # default threads, not niced


class Load:
    """N CPU-bound processes (a torch matmul loop each) running while the block runs."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._running: list[Any] = []

    def __enter__(self) -> Load:
        import subprocess

        self._running = [subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT]) for _ in range(self.processes)]
        time.sleep(3.0)  # torch imported and the loop running before anything is timed
        if any(p.poll() is not None for p in self._running):
            raise SystemExit("a load process exited at start")
        return self

    def cpu_s(self) -> float:
        """CPU seconds the load processes have used so far."""
        import psutil

        total = 0.0
        for process in self._running:
            try:
                times = psutil.Process(process.pid).cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return total

    def __exit__(self, *exc: object) -> None:
        for process in self._running:
            process.kill()
        for process in self._running:
            process.wait()


def cpu_seconds(engine: Any) -> float:
    """CPU seconds used so far by the engine: this process, or a server's whole process tree."""
    process = getattr(engine, "process", None) or getattr(getattr(engine, "server", None), "process", None)
    if process is None:
        return time.process_time()
    import psutil

    try:
        root = psutil.Process(process.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for member in tree:
        try:
            times = member.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


async def timed_batch(engine: InferenceEngine, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """Every prompt at once; tokens/s over the batch's wall time, and the CPU seconds the engine used."""
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    wall, cpu = time.perf_counter(), cpu_seconds(engine)
    results = await asyncio.gather(*[engine.generate(p, sampling) for p in prompts])
    wall, cpu = time.perf_counter() - wall, cpu_seconds(engine) - cpu
    tokens = sum(len(r.output_ids) for r in results)
    assert all(len(r.logprobs) == len(r.output_ids) for r in results), "every token needs its logprob"
    return {
        "wall_s": round(wall, 2),
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "cpu_s": round(cpu, 1),
        "tokens_per_cpu_s": round(tokens / cpu, 1) if cpu else None,
    }


async def weight_update_s(name: str, engine: Any, args: argparse.Namespace, tmp: Path) -> float:
    """Median seconds of three pushes of the served weights back into the engine."""
    model, _ = load_model(args.model, device="cpu", dtype=torch.float32)
    state = {k: v.detach() for k, v in model.named_parameters()}  # tied weights once, as the trainer pushes
    target: Any = state
    if not isinstance(engine, EmbeddedEngine):  # a server reloads from disk, as the trainer pushes to one
        model.save_pretrained(tmp / "weights", safe_serialization=True)
        target = str(tmp / "weights")
    times = []
    for version in range(1, 4):
        started = time.perf_counter()
        await engine.update_weights(target, version=version)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def decode_figures(engine: EmbeddedEngine, peak_gbps: float) -> dict[str, Any]:
    """Time split and bytes per decode step (weights once + every cached token read) against `peak_gbps`."""
    stats = engine.stats
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    kv_bytes = stats.decode_kv_tokens * engine.cache.layout.bytes_per_token
    steps = max(stats.decode_steps, 1)
    step_s = stats.decode_s / steps
    bytes_per_step = weight_bytes + kv_bytes / steps
    achieved = bytes_per_step / step_s / 1e9 if step_s else 0.0
    return {
        "prefill_s": round(stats.prefill_s, 2),
        "decode_s": round(stats.decode_s, 2),
        "decode_steps": stats.decode_steps,
        "mean_decode_batch": round(stats.mean_batch, 1),
        "decode_step_ms": round(step_s * 1e3, 2),
        "decode_tokens_per_s": round(stats.decode_rows / stats.decode_s, 1) if stats.decode_s else 0.0,
        "bytes_per_decode_step_mb": round(bytes_per_step / 2**20, 1),
        "achieved_gbps": round(achieved, 1),
        "peak_gbps": round(peak_gbps, 1),
        "fraction_of_bandwidth_bound": round(achieved / peak_gbps, 3) if peak_gbps else None,
    }


def peak_bandwidth(device: torch.device, given: float) -> float:
    if given:
        return given
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((gbps for key, gbps in GPU_PEAK_GBPS.items() if key in name), 0.0)
    return memory_read_gbps()


def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    rates = [r["tokens_per_s"] for r in runs]
    return {"runs": runs, "tokens_per_s_min": min(rates), "tokens_per_s_median": statistics.median(rates)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    # `local` names embedded
    names = [n if n in BUILDERS else engine_kind(n).name for n in (n.strip() for n in args.engines.split(",")) if n]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; choose from {', '.join(BUILDERS)}")
    prompts = make_prompts(args.sequences, args.prompt_tokens)
    engines: dict[str, tuple[Any, dict[str, Any]]] = {}
    report: dict[str, Any] = {"engines": {}}
    tmp = Path(args.out).parent / ".engines-bench-tmp"
    try:
        for name in names:
            engines[name] = await BUILDERS[name](args)
            await engines[name][0].generate(prompts[0][:16], SamplingParams(max_new_tokens=4, ignore_eos=True))
        runs = await repeats(engines, names, prompts, args)
        loaded: dict[str, list[dict[str, float]]] = {}
        if args.load:
            with Load(args.load) as load:
                loaded = await repeats(engines, names, prompts, args, load)
        for name in names:
            engine, info = engines[name]
            entry = {**info, **summary(runs[name])}
            if loaded:
                entry["loaded"] = summary(loaded[name])
                report[f"{name}_loaded_tokens_per_s"] = entry["loaded"]["tokens_per_s_median"]
                report[f"{name}_loaded_over_quiet"] = round(
                    entry["loaded"]["tokens_per_s_median"] / entry["tokens_per_s_median"], 3
                )
            if isinstance(engine, EmbeddedEngine):
                entry["decode"] = decode_figures(engine, peak_bandwidth(engine.cache.layout.device, args.peak_gbps))
                if args.check:
                    entry["exactness"] = await exactness(engine, args.model, prompts[:4], args.new_tokens)
            tmp.mkdir(parents=True, exist_ok=True)
            entry["weight_update_s"] = await weight_update_s(name, engine, args, tmp)
            report["engines"][name] = entry
            report[f"{name}_tokens_per_s"] = entry["tokens_per_s_median"]
    finally:
        for engine, _ in engines.values():
            await engine.close()
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    report["weight_update_s"] = {name: report["engines"][name]["weight_update_s"] for name in report["engines"]}
    if len(names) == 2:  # the first engine over the second (embedded_over_vllm by default), overall and per repeat
        first, second = names
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[first], runs[second])]
        overall = report[f"{first}_tokens_per_s"] / report[f"{second}_tokens_per_s"]
        report[f"{first}_over_{second}"] = round(overall, 3)
        report[f"{first}_over_{second}_per_repeat"] = [round(r, 3) for r in ratios]
        if loaded:
            overall = report[f"{first}_loaded_tokens_per_s"] / report[f"{second}_loaded_tokens_per_s"]
            report[f"{first}_over_{second}_loaded"] = round(overall, 3)
    for key in [k for k in report if k.startswith("embedded_")]:  # the figures under the engine's former name
        report["local_" + key.removeprefix("embedded_")] = report[key]
    return report


async def repeats(
    engines: dict[str, tuple[Any, dict[str, Any]]],
    names: list[str],
    prompts: list[list[int]],
    args: argparse.Namespace,
    load: Load | None = None,
) -> dict[str, list[dict[str, float]]]:
    """`args.repeats` timed batches per engine, engines taking turns (who goes first alternates)."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            engine = engines[name][0]
            if isinstance(engine, EmbeddedEngine):
                engine.stats = engine.scheduler.stats = type(engine.stats)()
            load_cpu = load.cpu_s() if load is not None else 0.0
            runs[name].append(await timed_batch(engine, prompts, args.new_tokens))
            if load is not None:  # how much of the machine the load got meanwhile
                runs[name][-1]["load_cpu_s"] = round(load.cpu_s() - load_cpu, 1)
            label = "loaded" if load is not None else "quiet"
            print(f"{label} repeat {repeat}: {name} {runs[name][-1]}  loadavg {os.getloadavg()[0]:.1f}", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="embedded,vllm", help=f"comma-separated, from {', '.join(BUILDERS)}")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--dtype", default="auto", help="embedded engine dtype: auto, float32 or bfloat16")
    parser.add_argument("--vllm-dtype", default="bfloat16", help="vLLM's --dtype")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prefill-chunk", type=int, default=-1, help="default: 512 on CPU, 8192 on CUDA")
    parser.add_argument("--kv-cache-mb", type=float, default=4096.0)
    parser.add_argument(
        "--threads", default="auto", help="the embedded engine's threads: auto (the rule), N, or 0 (torch's count)"
    )
    parser.add_argument("--peak-gbps", type=float, default=0.0, help="memory bandwidth to compare decode with")
    parser.add_argument("--load", type=int, default=0, help="CPU-bound load processes for a loaded measurement")
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the exactness figures")
    parser.add_argument("--out", default="benchmarks/results/engines.json")
    args = parser.parse_args()
    started = time.perf_counter()
    report = asyncio.run(run(args))
    report = {
        "workload": {
            "model": args.model,
            "sequences": args.sequences,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "temperature": 1.0,
            "repeats": args.repeats,
            "load_processes": args.load,
        },
        "machine": {
            "host": platform.node(),
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "load_average": os.getloadavg(),
        },
        "seconds": round(time.perf_counter() - started, 1),
        **report,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "engines"}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
