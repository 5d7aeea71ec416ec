"""How the trainer serves its policy: the engine a config asks for, and the learner's weights pushed into it after
each step (in-process tensors for the embedded engine, a saved directory for an HTTP engine, a state dict written
to /dev/shm and reloaded in place for vLLM on this machine, CUDA IPC tensors or an NCCL broadcast for SGLang with
engine.weight_sync tensor / nccl)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from envhub.inference import InferenceEngine
from envhub.trainer.config import TrainConfig
from envhub.trainer.learner.precision import export_weights, resolve_precision
from envhub.trainer.learner.step import Learner

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def local_engine_dtype(config: TrainConfig) -> Any:
    """The dtype a local engine serves the policy in: bf16 when the learner computes in bf16 (engine.dtype auto),
    else `engine.dtype` ("auto": bf16 on GPUs and on CPUs with bf16 units, fp32 elsewhere)."""
    learner_dtype = resolve_precision(config.model.device, config.model.dtype).engine_dtype
    if config.engine.dtype == "auto" and learner_dtype == torch.bfloat16:
        return torch.bfloat16
    return config.engine.dtype


def served_dtype(config: TrainConfig, model: Any) -> torch.dtype:
    """The torch dtype a local engine, or the held-out evaluation, serves `model` in on its device."""
    from envhub.trainer.engines.embedded.hardware import engine_dtype

    return engine_dtype(local_engine_dtype(config), next(model.parameters()).device)


async def build_engine(config: TrainConfig, model: Any, tokenizer: Any) -> InferenceEngine:
    """The engine `config.engine` describes, serving a copy of `model` in the engine dtype (the learner keeps its)."""
    cfg = config.engine
    if cfg.kind == "local":
        from envhub.trainer.engines.embedded.engine import LocalEngine
        from envhub.trainer.models import copy_as

        dtype = served_dtype(config, model)
        return LocalEngine(
            copy_as(model, dtype).eval(),
            tokenizer,
            max_batch_size=cfg.max_batch_size,
            prefix_cache_mb=cfg.prefix_cache_mb,
            prefill_chunk=cfg.prefill_chunk,
            dtype=dtype,
            kv_cache_mb=cfg.kv_cache_mb,
            cuda_graphs=None if cfg.cuda_graphs else False,
        )
    if cfg.kind == "vllm":
        return await _vllm_engine(config, model, tokenizer)
    from envhub.trainer.engines.sglang.deploy import build_deployment

    # attached (engine.url, checked now) or launched (engine.launch) SGLang servers, maybe behind sglang-router
    return await build_deployment(config, model, tokenizer)


async def _vllm_engine(config: TrainConfig, model: Any, tokenizer: Any) -> InferenceEngine:
    """Attach to `engine.url`, or export the policy (after any warm start) and launch `vllm serve` on it."""
    from envhub.trainer.engines.vllm.engine import VLLMEngine
    from envhub.trainer.models import save_model_dir

    cfg = config.engine
    client = {"api_key": cfg.api_key or None, "pause_mode": cfg.pause_mode}
    if cfg.url:
        return await VLLMEngine.attach(cfg.url, **client)  # a wrong URL fails now, not at every episode
    engine_dtype = resolve_precision(config.model.device, config.model.dtype).engine_dtype
    model_dir = Path(tempfile.mkdtemp(prefix="envhub-vllm-policy-")) / "model"
    await asyncio.to_thread(save_model_dir, model, tokenizer, model_dir, engine_dtype)
    positions = getattr(model.config, "max_position_embeddings", None) or 8192
    try:
        return await VLLMEngine.launch(
            model_dir,
            dtype=str(engine_dtype).removeprefix("torch."),
            max_model_len=cfg.max_model_len or min(positions, 8192),
            kv_cache_gib=cfg.kv_cache_gib,
            startup_timeout=cfg.startup_timeout_s,
            owned_paths=(model_dir.parent,),  # removed when the engine closes
            **client,
        )
    except BaseException:
        shutil.rmtree(model_dir.parent, ignore_errors=True)
        raise


async def push_weights(
    engine: InferenceEngine, learner: Learner, version: int, config: TrainConfig, out_dir: Path
) -> dict[str, float]:
    """Send the learner's weights, cast to the engine dtype, and label them `version`; returns the push's seconds
    (`push_s`, and for vLLM how long generation stood paused, `push_paused_s`)."""
    started = time.perf_counter()
    state = await asyncio.to_thread(learner.engine_state)  # LoRA merged; gathered from every process under FSDP
    if config.engine.kind == "local" or (config.engine.kind == "vllm" and _on_this_machine(config.engine.url)):
        await engine.update_weights(state, version=version)  # vLLM: safetensors in /dev/shm, reloaded in place
    elif config.engine.kind == "sglang" and config.engine.weight_sync != "disk":
        await engine.update_weights(state, version=version)  # SGLang: CUDA IPC tensors or an NCCL broadcast
    else:
        path = out_dir / "weights" / f"v{version:06d}"
        await asyncio.to_thread(export_weights, learner.hf_model(), path, learner.precision.engine_dtype, state)
        await engine.update_weights(str(path), version=version)
        for old in path.parent.glob("v*"):  # the server has loaded this one; older copies are dead weight
            if old != path:
                await asyncio.to_thread(shutil.rmtree, old, True)
    timing = {"push_s": time.perf_counter() - started}
    pushes = getattr(engine, "pushes", None)
    if config.engine.kind == "vllm" and pushes:
        timing["push_paused_s"] = pushes[-1].paused_s
    return timing


def _on_this_machine(url: str) -> bool:
    """True for a launched server (no URL) or one on a loopback address (it can read our /dev/shm)."""
    return not url or urlparse(url).hostname in _LOOPBACK
