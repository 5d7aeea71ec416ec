"""PrefixCache: KV of finished requests kept by token ids, so the next turn of an episode prefills only its new tokens.

A multi-turn episode sends its whole conversation each turn; everything but the newest messages was already
run through the model on the previous turn. Entries are looked up by the longest common prefix with the new
request (so the system prompt and tool schemas shared by every episode of a task are reused too), bounded in
bytes and evicted least recently used. The cache must be cleared whenever the weights change: KV computed
under old weights would not match what the new policy computes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from envhub.trainer.engines.embedded.kv_cache import RowKV, row_length


@dataclass
class PrefixCacheStats:
    """Lookups, hits and tokens whose prefill was skipped."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    evictions: int = 0


class PrefixCache:
    """LRU store of one-row KV caches keyed by the token ids they hold, bounded by `max_bytes`."""

    def __init__(self, max_bytes: int, min_reuse: int = 8) -> None:
        self.max_bytes = max_bytes
        self.min_reuse = min_reuse  # shorter matches are not worth a separate prefill
        self.bytes = 0
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[tuple[int, ...], tuple[torch.Tensor, RowKV, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: list[int], kv: RowKV) -> None:
        """Keep `kv` (which holds exactly `tokens`); entries it extends are dropped, old ones evicted to fit."""
        if not tokens or row_length(kv) != len(tokens) or self.max_bytes <= 0:
            return
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if size > self.max_bytes:
            return
        key = tuple(tokens)
        ids = torch.tensor(tokens, dtype=torch.long)
        for old in [k for k in self._entries if len(k) <= len(key) and key[: len(k)] == k]:
            self._remove(old)
        while self._entries and self.bytes + size > self.max_bytes:
            self._remove(next(iter(self._entries)))
            self.stats.evictions += 1
        self._entries[key] = (ids, kv, size)
        self.bytes += size

    def match(self, tokens: list[int]) -> tuple[int, RowKV | None]:
        """The longest cached prefix of `tokens`, leaving at least the last token to prefill: (length, its KV)."""
        self.stats.lookups += 1
        if not self._entries or len(tokens) < 2:
            return 0, None
        query = torch.tensor(tokens, dtype=torch.long)
        best, best_key = 0, None
        for key, (ids, _, _) in self._entries.items():
            n = min(len(ids), len(query) - 1)
            differ = (ids[:n] != query[:n]).nonzero()
            common = int(differ[0]) if len(differ) else n
            if common > best:
                best, best_key = common, key
        if best_key is None or best < self.min_reuse:
            return 0, None
        self._entries.move_to_end(best_key)
        kv = self._entries[best_key][1]
        self.stats.hits += 1
        self.stats.reused_tokens += best
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in kv]

    def clear(self) -> None:
        """Forget everything (after a weight update)."""
        self._entries.clear()
        self.bytes = 0

    def _remove(self, key: tuple[int, ...]) -> None:
        self.bytes -= self._entries.pop(key)[2]
