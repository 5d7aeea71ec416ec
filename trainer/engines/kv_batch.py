"""A left-padded batch of sequences sharing one KV cache; rows join (prefill + merge) and leave between decode steps."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

RowKV = list[
    tuple[torch.Tensor, torch.Tensor]
]  # one sequence's cache: per layer (keys, values), [1, heads, length, dim]


def row_length(kv: RowKV) -> int:
    """Tokens held by a one-row cache."""
    return int(kv[0][0].shape[2])


class DecodeBatch:
    """KV cache, attention mask and token counts of the rows being decoded, padded on the left to a common width.

    Invariant: the cache holds each row's context except its newest token, which the next `decode` feeds.
    """

    def __init__(self, cache: DynamicCache, mask: torch.Tensor, lengths: torch.Tensor) -> None:
        self.cache = cache
        self.mask = mask  # [rows, width] 1 for real tokens, 0 for left padding
        self.lengths = lengths  # [rows] real tokens in the cache = the position of the next token fed

    @property
    def size(self) -> int:
        """Number of rows."""
        return int(self.mask.shape[0])

    @property
    def width(self) -> int:
        """Padded cache length."""
        return int(self.mask.shape[1])

    @classmethod
    def prefill(
        cls, model: Any, contexts: list[list[int]], pad_id: int, pasts: list[RowKV | None] | None = None
    ) -> tuple[DecodeBatch, torch.Tensor]:
        """Run the contexts through the model (left-padded); returns the batch and each row's last-position logits.

        With `pasts`, row i's context continues the cached KV `pasts[i]` (a reused prefix or an earlier prefill
        chunk): pasts are left-padded to a common width, then each row's new tokens are left-padded after it, so
        the padding of a row may sit between its past and its new tokens (masked, like left padding).
        """
        device = model.device
        pasts = pasts or [None] * len(contexts)
        past_width = max((row_length(kv) for kv in pasts if kv is not None), default=0)
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), past_width + width), dtype=torch.long)
        for row, (context, past) in enumerate(zip(contexts, pasts)):
            ids[row, width - len(context) :] = torch.tensor(context, dtype=torch.long)
            mask[row, past_width + width - len(context) :] = 1
            if past is not None:
                mask[row, past_width - row_length(past) : past_width] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past_width:]
        cache = DynamicCache(config=model.config)
        if past_width:
            template = next(kv for kv in pasts if kv is not None)
            for layer, (keys, _values) in enumerate(template):
                shape = (1, keys.shape[1], 0, keys.shape[3])
                empty = keys.new_zeros(shape)
                cache.update(
                    torch.cat([_pad_left(kv[layer][0] if kv is not None else empty, past_width) for kv in pasts]),
                    torch.cat([_pad_left(kv[layer][1] if kv is not None else empty, past_width) for kv in pasts]),
                    layer,
                )
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        lengths = mask.sum(-1)
        return cls(out.past_key_values, mask, lengths), out.logits[:, -1, :].float()

    def row_kv(self, row: int) -> RowKV:
        """A copy of one row's cached keys and values without its padding: per layer [1, heads, length, dim]."""
        columns = self.mask[row].nonzero().squeeze(1)
        return [
            (layer.keys[row : row + 1].index_select(2, columns), layer.values[row : row + 1].index_select(2, columns))
            for layer in self.cache.layers
        ]

    def decode(self, model: Any, tokens: list[int]) -> torch.Tensor:
        """Feed one new token per row; returns next-token logits [rows, vocab] in float32."""
        device = self.mask.device
        ids = torch.tensor(tokens, dtype=torch.long, device=device).unsqueeze(1)
        self.mask = torch.cat([self.mask, torch.ones((self.size, 1), dtype=self.mask.dtype, device=device)], dim=1)
        positions = self.lengths.unsqueeze(1)
        out = model(
            input_ids=ids, attention_mask=self.mask, position_ids=positions, past_key_values=self.cache, use_cache=True
        )
        self.cache = out.past_key_values
        self.lengths = self.lengths + 1
        return out.logits[:, -1, :].float()

    def merge(self, other: DecodeBatch) -> None:
        """Append `other`'s rows after this batch's, padding the narrower one on the left."""
        width = max(self.width, other.width)
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)], dim=0)
            mine.values = torch.cat([_pad_left(mine.values, width), _pad_left(theirs.values, width)], dim=0)
        self.mask = torch.cat(
            [F.pad(self.mask, (width - self.width, 0)), F.pad(other.mask, (width - other.width, 0))], dim=0
        )
        self.lengths = torch.cat([self.lengths, other.lengths])

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order) and drop padding columns no remaining row needs."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        real = mask.any(dim=0).nonzero()
        start = int(real[0]) if len(real) else mask.shape[1]
        self.mask = mask[:, start:]
        self.lengths = self.lengths.index_select(0, index)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:]
            layer.values = layer.values.index_select(0, index)[:, :, start:]


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad a [batch, heads, length, dim] cache tensor on the left of its length axis."""
    return F.pad(tensor, (0, 0, width - tensor.shape[2], 0))
