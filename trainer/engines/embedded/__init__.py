"""The embedded engine: a transformers model served in-process with continuous batching, a preallocated KV cache,
a prefix cache, batched sampling with behavior logprobs and in-place weight updates."""

from envhub.trainer.engines.embedded.compute_thread import releasing_openmp
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.embedded.kind import served_dtype

__all__ = ["EmbeddedEngine", "releasing_openmp", "served_dtype"]
