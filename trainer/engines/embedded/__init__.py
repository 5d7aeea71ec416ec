"""The embedded engine: a transformers model served in-process with continuous batching, a preallocated KV cache,
a prefix cache, batched sampling with behavior logprobs and in-place weight updates.

The names below load on first use: validating a config reaches this package's engine kind, which must not cost
importing torch and transformers (3-5 s) before a bad setting is refused."""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "EmbeddedEngine": "envhub.trainer.engines.embedded.engine",
    "releasing_openmp": "envhub.trainer.engines.embedded.compute_thread",
    "served_dtype": "envhub.trainer.engines.embedded.kind",
}
__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name]), name)
