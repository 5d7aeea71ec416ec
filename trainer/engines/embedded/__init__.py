"""The embedded engine: a transformers model served in-process with continuous batching, a preallocated KV cache,
a prefix cache, batched sampling with behavior logprobs and in-place weight updates."""
