"""KVCache: keys and values preallocated per sequence slot, so a decode step writes in place instead of growing tensors.

Layout per layer: `[slots + 1, kv_heads, capacity, head_dim]`. Live rows occupy slots 0..rows-1 in the engine's
order (decoding rows first, then rows still being prefilled); the last slot is scratch, where padded rows of a
bucketed (CUDA graph) decode step write. A row holds its tokens at positions 0..length-1 with no padding, so a
decode step reads `keys[:rows, :, :width]`, one contiguous block per row.

The cache is bounded by `max_bytes`. On CPU it is sized to what the live rows need (rows x the longest row's
reservation) and reallocated when that grows or shrinks a lot; with `static=True` (CUDA graphs) it is allocated
once at the budget and never moves, so captured graphs stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from envhub.errors import EngineError
from envhub.trainer.engines.embedded.shapes import round_up

RowKV = list[
    tuple[torch.Tensor, torch.Tensor]
]  # one sequence's cache: per layer (keys, values), [1, heads, length, dim]


def row_length(kv: RowKV) -> int:
    """Tokens held by a one-row cache."""
    return int(kv[0][0].shape[2])


@dataclass(frozen=True)
class KVLayout:
    """Shape and type of a model's per-token KV."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @property
    def bytes_per_token(self) -> int:
        """Bytes of keys and values one token takes over all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()


class KVCache:
    """Slot-major keys/values of the live rows, their lengths, and the byte budget that bounds them."""

    def __init__(
        self, layout: KVLayout, max_bytes: int, *, max_rows: int, max_tokens: int, static: bool = False
    ) -> None:
        self.layout = layout
        self.max_bytes = max_bytes
        self.max_rows = max_rows
        self.max_tokens = max_tokens  # the model's context
        self.static = static
        self.lengths: list[int] = []  # tokens held by each live row
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.generation = 0  # bumped whenever the tensors move (captured graphs must be rebuilt)
        if static:
            tokens = min(max_tokens, max_bytes // ((max_rows + 1) * layout.bytes_per_token))
            tokens -= tokens % 256 if tokens >= 256 else 0  # whole key-width buckets (aligned for CUDA kernels)
            if tokens < 1:
                raise EngineError(
                    f"a KV budget of {max_bytes / 2**20:.0f} MiB holds no token for {max_rows} rows",
                    hint="raise engine.kv_cache_mb or lower engine.max_batch_size",
                )
            self._allocate(max_rows, tokens)

    @property
    def rows(self) -> int:
        """Live rows."""
        return len(self.lengths)

    @property
    def slots(self) -> int:
        """Allocated row slots (without the scratch slot)."""
        return int(self.keys[0].shape[0]) - 1 if self.keys else 0

    @property
    def capacity(self) -> int:
        """Allocated tokens per slot."""
        return int(self.keys[0].shape[2]) if self.keys else 0

    @property
    def bytes(self) -> int:
        """Bytes allocated."""
        return (self.slots + 1) * self.capacity * self.layout.bytes_per_token if self.keys else 0

    def tokens_per_row(self, rows: int) -> int:
        """The longest reservation `rows` rows may each have within the budget."""
        if self.static:
            return self.capacity
        return min(self.max_tokens, self.max_bytes // ((rows + 1) * self.layout.bytes_per_token))

    def fits(self, rows: int, tokens: int) -> bool:
        """Whether `rows` rows of up to `tokens` tokens each fit the budget."""
        return rows <= self.max_rows and tokens <= self.tokens_per_row(rows)

    def reserve(self, rows: int, tokens: int) -> None:
        """Make room for `rows` live rows of up to `tokens` tokens (reallocating and copying live rows if needed)."""
        if not self.fits(rows, tokens):
            raise EngineError(
                f"{rows} rows of {tokens} tokens need more KV cache than engine.kv_cache_mb allows "
                f"({self.max_bytes / 2**20:.0f} MiB)",
                hint="raise engine.kv_cache_mb, or send shorter requests",
            )
        if self.static or (rows <= self.slots and tokens <= self.capacity):
            return
        slots = max(rows, min(round_up(rows, 8), self.max_rows))
        capacity = max(tokens, min(round_up(tokens, 128), self.tokens_per_row(slots), self.max_tokens))
        if (slots + 1) * capacity * self.layout.bytes_per_token > self.max_bytes:
            slots, capacity = rows, tokens  # the rounded-up shape is over budget: the exact one is not
        self._allocate(max(slots, self.slots), max(capacity, self.capacity))

    def shrink(self, tokens: int) -> None:
        """Give memory back when the live rows need much less than is allocated (everything when none is left)."""
        if self.static or not self.keys:
            return
        if not self.rows:
            self.keys, self.values = [], []
            self.generation += 1
        elif self.bytes > 4 * (self.rows + 1) * max(tokens, 128) * self.layout.bytes_per_token:
            self._allocate(self.rows, max(tokens, max(self.lengths)))

    def _allocate(self, slots: int, capacity: int) -> None:
        """New zeroed tensors (zeros: masked positions must hold finite values), live rows copied over.

        Keys and values of every layer are views of one block: one allocation and one free per reshape, mapped
        and unmapped whole (`fix_malloc_mmap_threshold`).
        """
        layout = self.layout
        shape = (slots + 1, layout.kv_heads, capacity, layout.head_dim)
        block = torch.zeros((2, layout.layers, *shape), dtype=layout.dtype, device=layout.device)
        keys, values = [], []
        width = max(self.lengths, default=0)
        for layer in range(layout.layers):
            k, v = block[0, layer], block[1, layer]
            if self.keys and self.rows and width:
                k[: self.rows, :, :width] = self.keys[layer][: self.rows, :, :width]
                v[: self.rows, :, :width] = self.values[layer][: self.rows, :, :width]
            keys.append(k)
            values.append(v)
        self.keys, self.values = keys, values
        self.generation += 1

    def add_row(self, past: RowKV | None = None) -> int:
        """Append a live row (after `reserve`), holding `past` if given; returns its slot."""
        slot = self.rows
        if slot >= self.slots:
            raise EngineError("no free KV slot", hint="reserve() rows before adding them")
        length = row_length(past) if past is not None else 0
        if past is not None:
            for layer, (k, v) in enumerate(past):
                self.keys[layer][slot, :, :length] = k[0]
                self.values[layer][slot, :, :length] = v[0]
        self.lengths.append(length)
        return slot

    def row_kv(self, slot: int, length: int | None = None) -> RowKV:
        """A copy of the first `length` (default: all) tokens of a row: per layer [1, heads, length, dim]."""
        length = self.lengths[slot] if length is None else length
        return [
            (k[slot : slot + 1, :, :length].clone(), v[slot : slot + 1, :, :length].clone())
            for k, v in zip(self.keys, self.values)
        ]

    def keep(self, slots: list[int]) -> None:
        """Keep only the rows in `slots`, in that order, as slots 0..len-1 (each moved row is one copy)."""
        for new, old in enumerate(slots):
            if new != old:
                width = self.lengths[old]
                for k, v in zip(self.keys, self.values):
                    k[new, :, :width] = k[old, :, :width]
                    v[new, :, :width] = v[old, :, :width]
        self.lengths = [self.lengths[old] for old in slots]
