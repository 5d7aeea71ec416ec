"""Inference engines, one folder per family (embedded/, server/, sglang/, vllm/) beside what they share: the SGLang
protocol, routing, launching, resubmission, weight transfer and the outage watch. A run reaches them through its
engine kind (kinds.py): `engine_kind(config.engine.kind)` builds, pushes to, watches and serves the engine."""

from __future__ import annotations

from typing import Any

from envhub.inference import InferenceEngine
from envhub.trainer.engines.kinds import EngineKind, engine_kind, engine_kinds, register_engine_kind
from envhub.trainer.engines.protocol import episode_key
from envhub.trainer.engines.routing import MultiEngine, http_engines
from envhub.trainer.engines.watch import EngineDown, WatchedEngine

__all__ = [
    "EngineDown",
    "EngineKind",
    "MultiEngine",
    "WatchedEngine",
    "build_engine",
    "engine_kind",
    "engine_kinds",
    "episode_key",
    "http_engines",
    "register_engine_kind",
]


async def build_engine(config: Any, model: Any, tokenizer: Any) -> InferenceEngine:
    """The engine `config.engine` names, serving `model`'s weights (not yet watched: `EngineKind.watch`)."""
    return await engine_kind(config.engine.kind).build(config, model, tokenizer)
