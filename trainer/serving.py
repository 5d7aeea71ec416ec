"""How the trainer serves its policy: the engine a config asks for, and the learner's weights pushed into it after
each step (in-process tensors for the embedded engine, a saved directory for an HTTP engine)."""

from __future__ import annotations

import asyncio
import copy
import shutil
from pathlib import Path
from typing import Any

import torch

from envhub.inference import InferenceEngine
from envhub.trainer.config import TrainConfig
from envhub.trainer.learner.precision import export_weights, resolve_precision
from envhub.trainer.learner.step import Learner


def build_engine(config: TrainConfig, model: Any, tokenizer: Any) -> InferenceEngine:
    """The engine `config.engine` describes, serving a copy of `model` in the engine dtype (the learner keeps its)."""
    cfg = config.engine
    if cfg.kind == "local":
        from envhub.trainer.engines.local import LocalEngine

        learner_dtype = resolve_precision(config.model.device, config.model.dtype).engine_dtype
        bf16_learner = cfg.dtype == "auto" and learner_dtype == torch.bfloat16
        return LocalEngine(
            copy.deepcopy(model).eval(),
            tokenizer,
            max_batch_size=cfg.max_batch_size,
            prefix_cache_mb=cfg.prefix_cache_mb,
            prefill_chunk=cfg.prefill_chunk,
            dtype=torch.bfloat16 if bf16_learner else cfg.dtype,
            kv_cache_mb=cfg.kv_cache_mb,
            cuda_graphs=None if cfg.cuda_graphs else False,
        )
    from envhub.trainer.engines.routing import http_engines

    # several comma-separated URLs: sticky least-loaded routing over them
    return http_engines(cfg.url, api_key=cfg.api_key or None, pause_mode=cfg.pause_mode)


async def push_weights(
    engine: InferenceEngine, learner: Learner, version: int, config: TrainConfig, out_dir: Path
) -> None:
    """Send the learner's weights, cast to the engine dtype, and label them `version`."""
    state = await asyncio.to_thread(learner.engine_state)  # LoRA merged; gathered from every process under FSDP
    if config.engine.kind == "local":
        await engine.update_weights(state, version=version)
        return
    path = out_dir / "weights" / f"v{version:06d}"
    await asyncio.to_thread(export_weights, learner.hf_model(), path, learner.precision.engine_dtype, state)
    await engine.update_weights(str(path), version=version)
    for old in path.parent.glob("v*"):  # the server has loaded this one; older copies are dead weight
        if old != path:
            await asyncio.to_thread(shutil.rmtree, old, True)
