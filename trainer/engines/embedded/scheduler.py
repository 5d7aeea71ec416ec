"""Scheduler: which requests are waiting, being prefilled or decoding, and which step runs next.

Live requests own KV cache slots in order: decoding rows first (slots 0..running-1), then the rows being
prefilled. A request is admitted (given a slot) when the batch has room and the KV budget holds its reservation
(prompt + max_new_tokens); otherwise it waits, first come first served. A request that could never fit is refused
by the engine before it queues.

Prefill is chunked: a prefill step feeds at most `prefill_chunk` tokens, taken from the prefilling rows in order,
so only the last row of a step can stay partly prefilled; rows whose whole context is in the cache join the
decoding rows, whose slots they already follow. While rows decode, prefill steps alternate with decode steps.
A burst that arrives while nothing decodes is prefilled first, up to `IDLE_PREFILL_TOKENS`, in steps of
`burst_chunk` tokens, so that decoding starts at the burst's full batch: one big step on a GPU, chunk-sized steps
on a CPU, where a step of thousands of tokens runs several times slower per token (its activations leave the
caches).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from envhub.inference import FinishReason, SamplingParams
from envhub.trainer.engines.embedded.kv_cache import KVCache
from envhub.trainer.engines.embedded.prefix_cache import PrefixCache

IDLE_PREFILL_TOKENS = 8192  # tokens a burst prefills before its rows start decoding


@dataclass
class EngineStats:
    """Counters for measuring batching: steps run and rows they carried."""

    prefill_steps: int = 0
    decode_steps: int = 0
    decode_rows: int = 0
    max_rows: int = 0
    tokens: int = 0
    prefill_tokens: int = 0  # tokens run through the model by prefill steps (reused prefixes excluded)
    reused_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    max_prefills_between_decodes: int = 0  # consecutive prefill steps while rows waited to decode (1 with chunking)
    prefill_s: float = 0.0  # wall seconds in prefill steps (sampling included)
    decode_s: float = 0.0  # wall seconds in decode steps (sampling included)
    decode_kv_tokens: int = 0  # cached tokens read by decode steps (for bytes-per-step figures)
    thread_changes: int = 0  # times the thread rule changed the compute thread's torch threads
    _prefills_in_a_row: int = 0

    @property
    def mean_batch(self) -> float:
        """Average rows per decode step."""
        return self.decode_rows / self.decode_steps if self.decode_steps else 0.0


@dataclass(eq=False)
class Request:
    """One generation: its prompt, sampling settings and what it produced so far."""

    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    resubmit: bool
    stop_ids: frozenset[int] = frozenset()  # tokens that end it (EOS unless ignore_eos, plus stop_token_ids)
    reservation: int = 0  # KV tokens it may need: prompt + max_new_tokens, at most the context
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    retracts: int = 0
    finish: FinishReason | None = None
    on_token: Any = None  # called (in the step's worker thread) with (token, logprob, version) per new token

    def context(self) -> list[int]:
        return self.prompt_ids + self.output_ids


class Scheduler:
    """Request queues, KV slot ownership and the choice between prefill and decode steps."""

    def __init__(
        self,
        cache: KVCache,
        prefix_cache: PrefixCache,
        *,
        max_batch_size: int,
        prefill_chunk: int,
        burst_chunk: int = IDLE_PREFILL_TOKENS,
    ) -> None:
        self.cache = cache
        self.prefix_cache = prefix_cache
        self.max_batch_size = max_batch_size
        self.prefill_chunk = prefill_chunk  # tokens per prefill step; 0 = the whole prompts at once
        self.burst_chunk = max(burst_chunk, prefill_chunk)  # tokens per prefill step of a burst (see the docstring)
        self._burst_left = 0  # tokens the current burst may still prefill before its rows decode
        self.waiting: list[Request] = []
        self.prefilling: list[Request] = []  # admitted, context not (fully) in the cache yet
        self.running: list[Request] = []
        self.stats = EngineStats()
        self._decode_due = False

    @property
    def busy(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.prefilling or self.running)

    def admit(self) -> None:
        """Give waiting requests KV slots while the batch and the budget have room (in arrival order)."""
        while self.waiting:
            request = self.waiting[0]
            rows = len(self.running) + len(self.prefilling) + 1
            tokens = max([r.reservation for r in self.running + self.prefilling] + [request.reservation])
            if rows > self.max_batch_size or not self.cache.fits(rows, tokens):
                return
            self.cache.reserve(rows, tokens)
            reused, past = self.prefix_cache.match(request.context())
            self.stats.reused_tokens += reused
            self.cache.add_row(past)
            if request.generator is None and request.sampling.seed is not None:
                request.generator = torch.Generator(device=self.cache.layout.device).manual_seed(request.sampling.seed)
            self.prefilling.append(request)
            self.waiting.pop(0)

    def prefill_due(self) -> bool:
        """Prefill when rows wait for it and nothing decodes (a burst: until it is prefilled), or when the last step
        was a decode step."""
        if not self.prefilling:
            self._burst_left = 0
        elif not self.running:
            self._burst_left = IDLE_PREFILL_TOKENS  # a new burst: its ready rows wait for the rest of it
        if self._burst_left > 0:
            return True
        due = bool(self.prefilling) and (not self.running or not self._decode_due)
        if due:
            self._decode_due = True
            if self.running:
                self.stats._prefills_in_a_row += 1
                self.stats.max_prefills_between_decodes = max(
                    self.stats.max_prefills_between_decodes, self.stats._prefills_in_a_row
                )
        else:
            self._decode_due = False
            self.stats._prefills_in_a_row = 0
        return due

    def prefill_plan(self) -> tuple[int, list[list[int]]]:
        """The first prefilling slot and the token pieces of the next prefill step: at most `prefill_chunk` tokens
        while rows decode (they wait for it); in a burst at most `burst_chunk` tokens of what is left of it (nobody
        waits, and every row starts decoding together instead of decode steps running at a fraction of the batch
        between chunks)."""
        if self.prefill_chunk <= 0:
            budget = 1 << 62
        elif self._burst_left > 0:
            budget = min(self.burst_chunk, self._burst_left)
        else:
            budget = self.prefill_chunk
        first, pieces = len(self.running), []
        for offset, request in enumerate(self.prefilling):
            if budget <= 0:
                break
            held = self.cache.lengths[first + offset]
            piece = request.context()[held : held + budget]
            budget -= len(piece)
            pieces.append(piece)
        return first, pieces

    def prefilled(self, pieces: list[list[int]]) -> list[Request]:
        """After a prefill step: rows whose whole context is cached start decoding; returns them."""
        first = len(self.running)
        self.stats.prefill_steps += 1
        self.stats.prefill_tokens += sum(len(p) for p in pieces)
        self._burst_left = max(self._burst_left - sum(len(p) for p in pieces), 0)
        done = 0
        while done < len(pieces) and self.cache.lengths[first + done] == len(self.prefilling[done].context()):
            done += 1
        ready, self.prefilling = self.prefilling[:done], self.prefilling[done:]
        self.running += ready
        self.stats.max_rows = max(self.stats.max_rows, len(self.running))
        return ready

    def decoded(self) -> list[Request]:
        """Count a decode step of every running row; returns those rows."""
        self.stats.decode_steps += 1
        self.stats.decode_rows += len(self.running)
        self.stats.decode_kv_tokens += sum(self.cache.lengths[: len(self.running)]) + len(self.running)
        return self.running

    def remove(self, hit: Callable[[Request], bool], save_prefixes: bool = True) -> list[Request]:
        """Take matching live requests out of the batch (their cached tokens go to the prefix cache)."""
        live = self.running + self.prefilling
        gone = [r for r in live if hit(r)]
        if not gone:
            return []
        for slot, request in enumerate(live):
            held = self.cache.lengths[slot]
            # a running row holds its context minus the newest token; a prefilling row a prefix of its context
            if save_prefixes and hit(request) and 0 < held < len(request.context()):
                self.prefix_cache.put(request.context()[:held], self.cache.row_kv(slot))
        keep = [slot for slot, r in enumerate(live) if not hit(r)]
        self.cache.keep(keep)
        self.running = [r for r in self.running if not hit(r)]
        self.prefilling = [r for r in self.prefilling if not hit(r)]
        self.cache.shrink(max((r.reservation for r in self.running + self.prefilling), default=0))
        return gone

    def forget_partial_prefills(self) -> None:
        """Rows being prefilled start over (their cached part was computed under weights that just changed)."""
        first = len(self.running)
        for offset in range(len(self.prefilling)):
            self.cache.lengths[first + offset] = 0
