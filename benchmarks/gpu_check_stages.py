"""What each stage of `benchmarks/gpu_check.py` measures, each called in a process of its own with `note`, which
records figures as soon as they exist (a stage stopped at its cap keeps them)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_check import GIB, ROOT, copy_gbps, memory_verdict, write_json

RECIPE = ROOT / "configs" / "qwen2.5-1.5b-1gpu.yaml"
#: what --small changes in the recipe (beside model.name, budget.steps and evaluation) so that it runs on a CPU
SMALL_RECIPE = {
    "model": {"device": "cpu"},
    "machine": {"gpus": 0, "gpu_memory_gib": 0},
    "engine": {"max_batch_size": 8, "kv_cache_mb": 64, "prefix_cache_mb": 16},
    "rollout": {"group_size": 2, "max_turns": 2, "max_new_tokens": 8, "max_total_tokens": 1024, "concurrent_groups": 2},
    "algorithm": {"groups_per_step": 2, "max_tokens_per_micro_batch": 2048},
    "learner": {"logprob_chunk_tokens": 256},
}
ENGINE_WORKLOAD = {"sequences": 64, "prompt_tokens": 1024, "new_tokens": 256, "greedy_tokens": 32}
ENGINE_WORKLOAD_SMALL = {"sequences": 4, "prompt_tokens": 32, "new_tokens": 8, "greedy_tokens": 4}
Note = Callable[[dict[str, Any]], None]


def partial_writer(path: Path) -> Note:
    """A `note(figures)` that merges figures into the stage's result and rewrites its file at once."""
    figures: dict[str, Any] = {}

    def note(update: dict[str, Any]) -> None:
        figures.update(update)
        write_json(path, figures)

    return note


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_model(config: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """A model of `config`'s shape with random weights, initialised on `device` itself (no CPU copy first)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def load_tokenizer(args: argparse.Namespace) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(args.assets) / "smollm2")


def smollm2_config(args: argparse.Namespace) -> Any:
    """SmolLM2-135M's config from the assets (tiny sizes with --small)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(Path(args.assets) / "smollm2")
    if args.small:
        tiny = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
        for key, value in {**tiny, "num_key_value_heads": 2, "head_dim": 16}.items():
            setattr(config, key, value)
    return config


def qwen_config(args: argparse.Namespace, tokenizer: Any) -> Any:
    """Qwen2.5-1.5B's shape (envhub's table of published configs) over SmolLM2's tokenizer; tiny with --small."""
    from transformers import Qwen2Config

    from envhub.trainer.placement.shapes import KNOWN_SHAPES

    shape = KNOWN_SHAPES["qwen2.5-1.5b"]
    sizes = (shape.hidden, shape.intermediate, shape.layers, shape.heads, shape.kv_heads, shape.head_dim)
    hidden, intermediate, layers, heads, kv_heads, head_dim = (64, 128, 2, 4, 2, 16) if args.small else sizes
    return Qwen2Config(
        vocab_size=shape.vocab,  # Qwen2.5's; SmolLM2's tokenizer uses the first 49152 rows
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=shape.tied_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def peak_reader(device: torch.device) -> Callable[[], dict[str, float]]:
    """Peak memory from now on, GiB: torch's allocator on CUDA, the process's peak RSS on the CPU."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return lambda: {
            "allocated_gib": round(torch.cuda.max_memory_allocated(device) / GIB, 2),
            "reserved_gib": round(torch.cuda.max_memory_reserved(device) / GIB, 2),
        }
    from learner_memory import rss_mb

    return lambda: {"rss_gib": round(rss_mb("VmHWM") / 1024, 2)}


# -- environment ---------------------------------------------------------------------------------------------------
def environment(args: argparse.Namespace, note: Note) -> None:
    """Versions, the device, and the roofline references: bf16 matmul TFLOP/s and copy GB/s."""
    import transformers
    from learner_speed import matmul_tflops

    device = torch.device(args.device)
    import envhub

    note(
        {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "envhub_from": str(Path(envhub.__file__).parent),
        }
    )
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        note(
            {
                "gpu": props.name,
                "gpu_memory_gib": round(props.total_memory / GIB, 1),
                "cuda": torch.version.cuda,
                "multiprocessors": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
            }
        )
    else:
        note({"cpu": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads()})
    size = 512 if args.small else (8192 if device.type == "cuda" else 2048)
    tflops = matmul_tflops(torch.bfloat16, size, repeats=10, device=str(device))
    note({"bf16_matmul_tflops": round(tflops, 1 if device.type == "cuda" else 3), "matmul_size": size})
    nbytes = (64 if args.small else 2048) * 2**20
    source = torch.ones(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    best = float("inf")
    for _ in range(10):
        sync(device)
        started = time.perf_counter()
        target.copy_(source)
        sync(device)
        best = min(best, time.perf_counter() - started)
    note({"copy_gbps": round(copy_gbps(nbytes, best), 1), "copy_mib": nbytes // 2**20})


# -- engine --------------------------------------------------------------------------------------------------------
def engine(args: argparse.Namespace, note: Note) -> None:
    asyncio.run(_engine(args, note))


async def _engine(args: argparse.Namespace, note: Note) -> None:
    """64 sequences x (1024 + 256) tokens through the embedded engine: a cold batch, then two timed ones."""
    from engines import decode_figures, make_prompts, peak_bandwidth, timed_batch

    from envhub.trainer.engines.embedded.engine import EmbeddedEngine

    device = torch.device(args.device)
    work = ENGINE_WORKLOAD_SMALL if args.small else ENGINE_WORKLOAD
    started = time.perf_counter()
    model = random_model(smollm2_config(args), device, torch.bfloat16)
    with torch.no_grad():  # logits a few nats apart, so that greedy choices are rarely near-ties
        model.get_output_embeddings().weight.normal_(0.0, 0.3)
    tokenizer = load_tokenizer(args)
    params = sum(p.numel() for p in model.parameters())
    note(
        {
            "model": "SmolLM2-135M shape, random weights",
            "params_m": round(params / 1e6, 1),
            "dtype": "bfloat16",
            "workload": work,
            "build_s": round(time.perf_counter() - started, 1),
        }
    )
    engine = EmbeddedEngine(
        model,
        tokenizer,
        max_batch_size=work["sequences"],
        prefill_chunk=8192 if device.type == "cuda" else 512,
        kv_cache_mb=64.0 if args.small else 4096.0,
    )
    note({"cuda_graphs": engine.decode_step.graphs})
    prompts = make_prompts(work["sequences"], work["prompt_tokens"])
    try:
        runs = []
        for _ in range(3):
            engine.stats = engine.scheduler.stats = type(engine.stats)()
            runs.append(await timed_batch(engine, prompts, work["new_tokens"]))
            note({"runs": runs})
        warm = round(statistics.median(r["tokens_per_s"] for r in runs[1:]), 1)
        bound = peak_bandwidth(device, 0.0)
        note({"cold_tokens_per_s": runs[0]["tokens_per_s"], "tokens_per_s": warm})
        note(
            {
                "decode": decode_figures(engine, bound),
                "peak_gbps_source": "data sheet" if device.type == "cuda" else "measured read bandwidth",
            }
        )
        note({"exactness": await greedy_exactness(engine, prompts[:4], work["greedy_tokens"])})
    finally:
        await engine.close()


async def greedy_exactness(engine: Any, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    """The engine's greedy tokens against a transformers forward of the same weights, in bf16 and in fp32."""
    from engine_checks import greedy_agreement, teacher_forced_logits

    from envhub.inference import SamplingParams
    from envhub.trainer.models import copy_as

    greedy = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
    outputs = [(await engine.generate(prompt, greedy)).output_ids for prompt in prompts]
    report = {}
    for label, dtype in (("vs_bf16_forward", torch.bfloat16), ("vs_fp32_forward", torch.float32)):
        reference = copy_as(engine.model, dtype)
        totals = {"positions": 0, "equal": 0, "ties": 0, "wrong": 0}
        for prompt, output in zip(prompts, outputs):
            counts = greedy_agreement(teacher_forced_logits(reference, prompt, output), output, 0.1)
            totals = {k: totals[k] + counts[k] for k in totals}
        report[label] = totals
        del reference
    return report


# -- learner -------------------------------------------------------------------------------------------------------
def learner(args: argparse.Namespace, note: Note) -> None:
    """One GRPO step on SmolLM2-135M's shape (fp32 masters, bf16 autocast), the batch shaped by the recipe."""
    from learner_speed import demo_batch, measure, step_flops

    from envhub.trainer.config import config_from_dict
    from envhub.trainer.learner.step import Learner
    from envhub.trainer.placement.memory import learner_memory
    from envhub.trainer.placement.placement import learner_settings
    from envhub.trainer.placement.shapes import shape_from_config

    device = torch.device(args.device)
    data, _ = recipe_data(args, "smollm2")
    config = config_from_dict(data)
    config.algorithm.max_initial_kl = 0.0  # random ids: the behaviour logprobs are placeholders
    model_config = smollm2_config(args)
    model, tokenizer = random_model(model_config, device, torch.float32), load_tokenizer(args)
    step_learner = Learner.from_config(config, model, tokenizer)
    groups = demo_batch(config, min(model_config.vocab_size, 40000), seed=0)
    trajs = [t for g in groups for t in g]
    model_tokens, tokens = sum(sum(t.loss_mask) for t in trajs), sum(len(t.input_ids) for t in trajs)
    note(
        {
            "model": "SmolLM2-135M shape, random weights",
            "episodes": len(trajs),
            "model_tokens": model_tokens,
            "tokens": tokens,
            "gradient_checkpointing": config.learner.gradient_checkpointing,
        }
    )
    peak = peak_reader(device)
    timing = measure(step_learner.step, groups, 1 if args.small else 3, None)
    flops = step_flops(step_learner.hf_model(), groups, config.learner.train_layers)
    shape = shape_from_config(model_config.to_dict(), "SmolLM2-135M")
    planned = learner_memory(shape, learner_settings(config, device.type == "cuda")).peak
    measured = peak()
    measured_gib = measured.get("allocated_gib", measured.get("rss_gib", 0.0))
    note(
        {
            **timing,
            "trained_tokens_per_s": round(model_tokens / timing["step_s"], 1),
            "tokens_per_s": round(tokens / timing["step_s"], 1),
            "tflops": round(flops / timing["step_s"] / 1e12, 3),
            "peak": measured,
            "dry_run_learner_gib": round(planned / GIB, 2),
            "memory_vs_dry_run": memory_verdict(measured_gib * GIB, planned),
        }
    )


# -- recipe --------------------------------------------------------------------------------------------------------
def recipe_data(args: argparse.Namespace, model_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shipped one-GPU recipe as plain data with the check's overrides, and the overrides alone."""
    import yaml

    data = yaml.safe_load(RECIPE.read_text())
    overrides: dict[str, Any] = {
        "model": {"name": model_name},
        "budget": {"steps": 2},
        "evaluation": {"episodes": 0},
        # random weights answer nothing right: every group's rewards are equal, and filtering would train nothing
        "algorithm": {"filter_zero_variance": False},
    }
    if args.small:
        for section, values in SMALL_RECIPE.items():
            overrides[section] = {**overrides.get(section, {}), **values}
    for section, values in overrides.items():
        data[section] = {**(data.get(section) or {}), **values}
    return data, overrides


def outside_allocator(device: torch.device) -> int:
    """Bytes the GPU holds beyond torch's allocator (CUDA context, loaded kernels), read now."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def recipe(args: argparse.Namespace, note: Note) -> None:
    """configs/qwen2.5-1.5b-1gpu.yaml for 2 steps on a random Qwen2.5-1.5B-shaped model: peak memory vs the dry-run.

    The GPU's peak in use is the allocator's peak reservation plus what lies outside it (read at the end, when the
    most kernels are loaded); nothing polls the GPU meanwhile: a CUDA call from another thread, outside the lock the
    learner shares with the engine's graph captures, can break a capture (trainer/run/graph_capture.py). On the CPU
    the figure is the process's peak RSS."""
    import yaml

    from envhub.trainer.config import load_config

    device, work = torch.device(args.device), Path(args.work)
    started = time.perf_counter()
    tokenizer = load_tokenizer(args)
    model_dir = work / ("qwen-tiny-random" if args.small else "qwen2.5-1.5b-random")
    model = random_model(qwen_config(args, tokenizer), device, torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    data, overrides = recipe_data(args, str(model_dir))
    (work / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    config = load_config(work / "recipe.yaml")
    note(
        {
            "config": str(RECIPE.relative_to(ROOT)),
            "overrides": overrides,
            "params_b": round(params / 1e9, 3),
            "model": "Qwen2.5-1.5B shape (vocabulary 151936), random weights; SmolLM2's tokenizer (49152 ids)",
            "build_s": round(time.perf_counter() - started, 1),
        }
    )
    planned = dry_run_bytes(config)
    note({"dry_run": planned})
    peak = peak_reader(device)
    rows: list[dict[str, Any]] = []

    def on_step(row: dict[str, Any]) -> None:  # before the step's checkpoint is written
        keys = (
            "step",
            "step_s",
            "model_tokens",
            "turns",
            "time/learner_s",
            "time/push_s",
            "time/wait_s",
            "engine/decode_tokens_per_s",
        )
        rows.append({k: round(v, 2) if isinstance(v, float) else v for k in keys if (v := row.get(k)) is not None})
        note({"steps": rows, "peak_before_save": peak()})

    result = run_trainer(config, work / "run", on_step)
    final = peak()
    if device.type == "cuda":
        outside = outside_allocator(device)
        measured = final["reserved_gib"] * GIB + outside
        final["outside_allocator_gib"] = round(outside / GIB, 2)
    else:
        measured = final["rss_gib"] * GIB
    note(
        {
            "steps_done": result.last_step,
            "stop_reason": result.stop_reason,
            "wall_s": round(result.wall_s, 1),
            "peak": final,
            "peak_gib": round(measured / GIB, 2),
            "peak_measures": "GPU memory in use: reserved + outside the allocator"
            if device.type == "cuda"
            else "process RSS (CPU): not what the dry-run's host figure plans",
            "memory": memory_verdict(measured, planned["bytes"]),
        }
    )


def run_trainer(config: Any, out_dir: Path, on_step: Callable[[dict[str, Any]], None]) -> Any:
    from envhub.trainer.train import Trainer

    return asyncio.run(Trainer(config, out_dir=out_dir, on_step=on_step).run(overwrite=True))


def dry_run_bytes(config: Any) -> dict[str, Any]:
    """`envhub train --dry-run`'s figure for this config: what GPU 0 must hold (host memory on a CPU run)."""
    from envhub.trainer.placement.machine import machine_for
    from envhub.trainer.placement.placement import plan_placement

    placement = plan_placement(config, machine_for(stated=config.machine))
    gpu0 = placement.gpu_use().get(0)
    total = sum(b for _, b in gpu0) if gpu0 else placement.host_use()
    return {
        "bytes": total,
        "gib": round(total / GIB, 2),
        "of": "GPU 0" if gpu0 else "host",
        "stages": {s.name: round((s.gpu_bytes if gpu0 else s.host_bytes) / GIB, 2) for s in placement.stages},
        "refusals": placement.refusals,
    }


STAGES: dict[str, Callable[[argparse.Namespace, Note], None]] = {
    "environment": environment,
    "engine": engine,
    "learner": learner,
    "recipe": recipe,
}
