"""How the trainer serves its policy: the engine a config asks for, and the learner's weights pushed into it after
each step (in-process tensors for the embedded engine, a saved directory for an HTTP engine)."""

from __future__ import annotations

import asyncio
import copy
import shutil
from pathlib import Path
from typing import Any

from envhub.inference import InferenceEngine
from envhub.trainer.config import TrainConfig
from envhub.trainer.learner.precision import export_weights, resolve_precision
from envhub.trainer.learner.step import Learner


def build_engine(config: TrainConfig, model: Any, tokenizer: Any) -> InferenceEngine:
    """The engine `config.engine` describes, serving a copy of `model` in the engine dtype (the learner keeps its)."""
    cfg = config.engine
    if cfg.kind == "local":
        from envhub.trainer.engines.local import LocalEngine

        engine_dtype = resolve_precision(config.model.device, config.model.dtype).engine_dtype
        return LocalEngine(
            copy.deepcopy(model).to(engine_dtype).eval(),
            tokenizer,
            max_batch_size=cfg.max_batch_size,
            prefix_cache_mb=cfg.prefix_cache_mb,
            prefill_chunk=cfg.prefill_chunk,
        )
    from envhub.trainer.engines.sglang_deploy import deployment_from_config

    # attached (engine.url) or launched (engine.launch) SGLang servers, maybe behind sglang-router
    return deployment_from_config(config, model, tokenizer)


async def push_weights(
    engine: InferenceEngine, learner: Learner, version: int, config: TrainConfig, out_dir: Path
) -> None:
    """Send the learner's weights, cast to the engine dtype, and label them `version`."""
    state = await asyncio.to_thread(learner.engine_state)  # LoRA merged; gathered from every process under FSDP
    if config.engine.kind == "local" or config.engine.weight_sync != "disk":  # in-process, CUDA IPC or NCCL
        await engine.update_weights(state, version=version)
        return
    path = out_dir / "weights" / f"v{version:06d}"
    await asyncio.to_thread(export_weights, learner.hf_model(), path, learner.precision.engine_dtype, state)
    await engine.update_weights(str(path), version=version)
    for old in path.parent.glob("v*"):  # the server has loaded this one; older copies are dead weight
        if old != path:
            await asyncio.to_thread(shutil.rmtree, old, True)
