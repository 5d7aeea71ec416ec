"""DecodeStep: one decode step of the running rows; on CUDA it replays CUDA graphs captured per padded bucket.

A decode step is ~450 small kernels for a 30-layer model; launching them from Python costs more than running
them on a GPU. With graphs, the step is captured once per (batch bucket, key-width bucket) after a warm-up and
replayed: the inputs go into static buffers (tokens, positions, the slots rows write to), the batch is padded up
to its bucket (padded rows write into the cache's scratch slot and their logits are dropped) and attention reads
a fixed width of keys (a multiple of `width_step`, masked per row). The KV cache must not move while graphs
exist (`KVCache(static=True)`); if it does, the graphs are dropped and captured again. A capture holds
`CAPTURE_LOCK` and restricts only its own thread, so the learner's thread keeps working on the same GPU
(trainer/run/graph_capture.py).

Without graphs (CPU, or `graphs=False`) the same `ModelRunner.decode` runs eagerly on the exact batch and width.
Bucket choice and the padded static-buffer path run on CPU too (`graphs=False, pad_to_buckets=True`), which is
how they are tested without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from envhub.trainer.engines.embedded.model_runner import ModelRunner
from envhub.trainer.engines.embedded.shapes import batch_bucket, width_bucket
from envhub.trainer.run.graph_capture import CAPTURE_LOCK


@dataclass
class StaticInputs:
    """The buffers a captured decode step reads: a token, its position and the slot it writes to, per row."""

    tokens: torch.Tensor
    positions: torch.Tensor
    write_slots: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, device: torch.device) -> StaticInputs:
        zeros = torch.zeros(rows, dtype=torch.long, device=device)
        return cls(zeros, zeros.clone(), zeros.clone())

    def fill(self, tokens: list[int], positions: list[int], scratch_slot: int) -> None:
        """Live rows first; padded rows get token 0 at position 0, writing into the scratch slot."""
        rows, live = self.tokens.shape[0], len(tokens)
        pad = rows - live
        host = torch.tensor(
            [tokens + [0] * pad, positions + [0] * pad, list(range(live)) + [scratch_slot] * pad], dtype=torch.long
        )
        self.tokens.copy_(host[0], non_blocking=True)
        self.positions.copy_(host[1], non_blocking=True)
        self.write_slots.copy_(host[2], non_blocking=True)


class DecodeStep:
    """Decodes the cache's first `len(tokens)` rows; graphs on CUDA unless disabled."""

    def __init__(
        self,
        runner: ModelRunner,
        *,
        graphs: bool | None = None,
        pad_to_buckets: bool | None = None,
        width_step: int = 256,
    ) -> None:
        self.runner = runner
        self.cache = runner.cache
        on_cuda = runner.device.type == "cuda"
        self.graphs = on_cuda if graphs is None else graphs
        if self.graphs and not on_cuda:
            raise ValueError("CUDA graphs need a CUDA device")
        self.pad_to_buckets = self.graphs if pad_to_buckets is None else (pad_to_buckets or self.graphs)
        self.width_step = width_step
        self._inputs: dict[int, StaticInputs] = {}
        self._graphs: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
        self._generation = self.cache.generation
        self._pool: Any = None
        self.captures = 0

    def __call__(self, tokens: list[int]) -> torch.Tensor:
        """Logits [rows, vocab] (float32) for one new token per running row; positions come from the cache."""
        rows = len(tokens)
        positions = self.cache.lengths[:rows]
        if not self.pad_to_buckets:
            device = self.runner.device
            out = self.runner.decode(
                torch.tensor(tokens, dtype=torch.long, device=device),
                torch.tensor(positions, dtype=torch.long, device=device),
                torch.arange(rows, device=device),
                max(positions) + 1,
            )
        else:
            out = self._padded(tokens, positions)
        for row in range(rows):
            self.cache.lengths[row] += 1
        return out

    def _padded(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        rows = len(tokens)
        bucket = batch_bucket(rows, self.cache.slots)
        width = width_bucket(max(positions) + 1, self.cache.capacity, self.width_step)
        inputs = self._inputs.get(bucket)
        if inputs is None:
            inputs = self._inputs[bucket] = StaticInputs.allocate(bucket, self.runner.device)
        if not self.graphs:
            inputs.fill(tokens, positions, self.cache.slots)
            return self.runner.decode(inputs.tokens, inputs.positions, inputs.write_slots, width)[:rows]
        if self._generation != self.cache.generation:  # the cache moved: captured addresses are stale
            self._graphs.clear()
            self._generation = self.cache.generation
        graph = self._graphs.get((bucket, width))
        if graph is None:
            graph = self._graphs[(bucket, width)] = self._capture(inputs, width)
        inputs.fill(tokens, positions, self.cache.slots)
        graph[0].replay()
        return graph[1][:rows]

    def _capture(self, inputs: StaticInputs, width: int) -> tuple[Any, torch.Tensor]:
        """Warm up on a side stream, then capture; both write only into the scratch slot."""
        inputs.fill([], [], self.cache.slots)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.runner.decode(inputs.tokens, inputs.positions, inputs.write_slots, width)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # the learner may work on this GPU from its own thread meanwhile: trainer/run/graph_capture.py says how
        with CAPTURE_LOCK, torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = self.runner.decode(inputs.tokens, inputs.positions, inputs.write_slots, width)
        self.captures += 1
        return graph, out
