"""Token-budget micro-batches and chunked logprobs: learner memory follows tokens per micro-batch, not batch x longest.

Sequences are sorted by length and packed into micro-batches whose padded size (rows x longest row)
stays within `max_tokens`; each micro-batch is padded only to its own longest row. Logprobs of model
tokens are computed `chunk_tokens` at a time; when there is more than one chunk each runs under activation
checkpointing, so at most one chunk's [chunk, vocab] logits exist at once, in forward and again in backward.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def plan_micro_batches(
    lengths: list[int], max_tokens: int, max_sequences: int = 0, groups: list[int] | None = None
) -> list[list[int]]:
    """Row indices grouped longest first so that rows x longest <= max_tokens (a longer row goes alone).

    With `groups` (each row's group), a group's rows stay next to each other, groups with the longest row first,
    so that rows sharing a prompt share micro-batches (`TokenLogprobs(share_prefix=True)` runs it once)."""
    if groups is None:
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    else:
        longest = {g: max(n for n, h in zip(lengths, groups) if h == g) for g in set(groups)}
        order = sorted(range(len(lengths)), key=lambda i: (-longest[groups[i]], groups[i], -lengths[i], i))
    plan: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        full = max_sequences and len(current) >= max_sequences
        if current and (full or (len(current) + 1) * longest > max_tokens):
            plan.append(current)
            current = []
        current.append(i)
    if current:
        plan.append(current)
    return plan


@dataclass
class MicroBatch:
    """Padded tensors of some rows of a step; `rows` index the step's flat list of sequences."""

    rows: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    behavior_logprobs: torch.Tensor
    versions: torch.Tensor
    advantages: torch.Tensor
    stale: torch.Tensor | None = None  #: model tokens older than the staleness bound (importance-corrected)

    @property
    def padded_tokens(self) -> int:
        """Rows x width: what the forward pass costs."""
        return int(self.input_ids.numel())


def pad_rows(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> torch.Tensor:
    """Right-pad lists to the longest and stack them."""
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: Any, scale: float) -> torch.Tensor:
    # logit of the target minus logsumexp: one [chunk, vocab] fp32 tensor instead of a full log_softmax copy
    logits = head(hidden).float() / scale
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def chunked_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head: Any, temperature: float, chunk_tokens: int
) -> torch.Tensor:
    """log_softmax(head(hidden) / T)[target] for [N, H] hidden states, `chunk_tokens` rows at a time."""
    scale = temperature if temperature > 0 else 1.0
    chunk_tokens = max(chunk_tokens, 1)
    # one chunk's logits may stay for backward; with several, each is recomputed in backward instead of kept
    recompute = torch.is_grad_enabled() and hidden.requires_grad and hidden.shape[0] > chunk_tokens
    parts = []
    for lo in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[lo : lo + chunk_tokens], targets[lo : lo + chunk_tokens]
        if recompute:
            parts.append(checkpoint(_chunk_logprobs, h, t, head, scale, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(h, t, head, scale))
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


def _parts(model: Any) -> tuple[Any, Any]:
    """(decoder body, output head) of a causal LM, a peft-wrapped one included."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(inner, inner.base_model_prefix), inner.get_output_embeddings()


class TokenLogprobs(torch.nn.Module):
    """[B, T] logprob of token t given tokens < t as log_softmax(logits / T) in fp32, on model tokens only.

    The engine's convention (temperature <= 0 counts as 1). Positions where `loss_mask` is 0 get 0:
    the vocabulary projection runs only on model tokens. This module is what DDP / FSDP wrap, so that
    their forward hooks see one forward per micro-batch. `share_prefix` runs a prefix every row shares once
    (`_hidden`); it needs transformers' KV cache, which gradient checkpointing drops, so not with it.
    """

    def __init__(self, model: Any, temperature: float, chunk_tokens: int = 4096, share_prefix: bool = False) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens
        self.share_prefix = share_prefix

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        """Logprobs [B, T] (0 where loss_mask is 0 and at t = 0)."""
        body, head = _parts(self.model)
        hidden = self._hidden(body, input_ids, attention_mask)[:, :-1]
        where = loss_mask[:, 1:].bool()
        picked = chunked_logprobs(hidden[where], input_ids[:, 1:][where], head, self.temperature, self.chunk_tokens)
        token_lp = torch.zeros(where.shape, dtype=torch.float32, device=hidden.device).masked_scatter(where, picked)
        return torch.nn.functional.pad(token_lp, (1, 0))

    def _hidden(self, body: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden states [B, T, H]; a prefix every row shares runs once, its keys and values
        repeated for the rows' own tokens (gradients from every row meet in the one prefix computation)."""
        rows = input_ids.shape[0]
        shared = shareable_prefix(input_ids, attention_mask) if self.share_prefix else 0
        if not shared:
            return body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        prefix = body(input_ids=input_ids[:1, :shared], use_cache=True)
        cache = prefix.cache if hasattr(prefix, "cache") else prefix.past_key_values
        cache.batch_repeat_interleave(rows)
        past = {_cache_keyword(type(body)): cache}
        rest = body(input_ids=input_ids[:, shared:], attention_mask=attention_mask, **past)
        return torch.cat([prefix.last_hidden_state.expand(rows, -1, -1), rest.last_hidden_state], dim=1)


MIN_SHARED_PREFIX = 32  #: shorter shared prefixes run with the rest: a second pass through the layers costs more


def shared_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading positions every row holds the same real token at, leaving each row at least one of its own
    positions (so the rows' pass has something to compute)."""
    same = ((input_ids == input_ids[:1]) & attention_mask.bool()).all(dim=0)
    differ = (~same).nonzero()
    length = int(differ[0]) if len(differ) else input_ids.shape[1]
    return min(length, input_ids.shape[1] - 1)


def shareable_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """The shared prefix worth running once: at least `MIN_SHARED_PREFIX` tokens over two rows or more, else 0."""
    shared = shared_prefix(input_ids, attention_mask) if input_ids.shape[0] > 1 else 0
    return shared if shared >= MIN_SHARED_PREFIX else 0


def prompt_groups(groups: list[list[list[int]]]) -> list[int]:
    """A key per row of the step's flat list: a group's rows share one when they begin with at least
    `MIN_SHARED_PREFIX` common tokens (its prompt), every other row has its own (`plan_micro_batches`' groups)."""
    keys: list[int] = []
    for rows in groups:
        common = len(os.path.commonprefix(rows)) if len(rows) > 1 else 0
        first = len(keys)
        keys += [first] * len(rows) if common >= MIN_SHARED_PREFIX else range(first, first + len(rows))
    return keys


@functools.cache
def _cache_keyword(decoder: type) -> str:
    """transformers 5 renamed a decoder's `past_key_values` argument `cache` (the old name still works, warning)."""
    import inspect

    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
