"""LocalEngine: a transformers model served in-process with continuous batching, logprobs and in-place weight updates.

An asyncio scheduler admits waiting requests between steps and runs each step (a batched prefill of the
newcomers, or one batched decode step of every running row) in a worker thread. Requests join and leave
between steps, so a long generation never holds up short ones. Logprobs: see `envhub.trainer.engines.sampler`.

Multi-turn speed: a finished request's KV stays in a `PrefixCache`, so the next turn of the same episode (whose
prompt starts with the previous turn's tokens) prefills only its new tokens. Prefill is chunked: at most
`prefill_chunk` tokens per step, and prefill steps alternate with decode steps while rows are decoding, so a long
prompt never stalls the generations already running.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import itertools
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from envhub.errors import EngineError
from envhub.inference import FinishReason, GenerateResult, InferenceEngine, SamplingParams
from envhub.trainer.engines.kv_batch import DecodeBatch, RowKV
from envhub.trainer.engines.prefix_cache import PrefixCache
from envhub.trainer.engines.sampler import sample_next
from envhub.trainer.engines.weights import load_state

PauseMode = Literal["abort", "retract", "in_place"]
_ids = itertools.count()
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


@functools.cache
def fix_malloc_mmap_threshold(threshold: int = 64 * 1024) -> bool:
    """Serve CPU tensors of `threshold` bytes or more from fresh mmaps (glibc only); True when applied.

    glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which KV-cache
    tensors of ever-changing sizes come from the heap, fragment it and are never returned: a multi-turn engine
    on CPU then grew by about 1 GB a minute with the live data flat. A fixed threshold disables that adjustment
    (as MALLOC_MMAP_THRESHOLD_ does), so freed tensors go back to the OS.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt): nothing to fix
        return False


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
    _prefills_in_a_row: int = 0

    @property
    def mean_batch(self) -> float:
        """Average rows per decode step."""
        return self.decode_rows / self.decode_steps if self.decode_steps else 0.0


@dataclass(eq=False)
class _Request:
    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    resubmit: bool
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    retracts: int = 0
    finish: FinishReason | None = None
    past: RowKV | None = None  # KV of context()[:past_len] while the request is being prefilled
    past_len: int = 0
    on_token: Any = None  # called (in the step's worker thread) with (token, logprob, version) per new token

    def context(self) -> list[int]:
        return self.prompt_ids + self.output_ids


class LocalEngine(InferenceEngine):
    """Serves a transformers causal LM on CPU or GPU; greedy output equals `model.generate`'s token for token."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_batch_size: int = 64,
        eos_token_ids: tuple[int, ...] | None = None,
        version: int = 0,
        prefix_cache_mb: float = 256.0,
        prefill_chunk: int = 512,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        fix_malloc_mmap_threshold()
        self.version = version
        self.stats = EngineStats()
        if eos_token_ids is None:
            eos = getattr(model.generation_config, "eos_token_id", None) or getattr(tokenizer, "eos_token_id", None)
            eos_token_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        self.eos_token_ids = eos_token_ids
        self.pad_id = eos_token_ids[0] if eos_token_ids else 0
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self._waiting: list[_Request] = []
        self._prefilling: list[_Request] = []  # admitted, prompt not (fully) in the batch yet
        self._running: list[_Request] = []
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20))
        self.prefill_chunk = prefill_chunk  # tokens per prefill step; 0 = the whole prompts at once
        self._decode_due = False
        self._batch: DecodeBatch | None = None
        self._paused = False
        self._closed = False
        self._lock = asyncio.Lock()  # held for each step and for every change to the running batch
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_pretrained(cls, model: str = "smollm2", device: str | None = None, **kwargs: Any) -> LocalEngine:
        """An engine over "smollm2", "tiny" or a local HF directory, on CUDA (bf16) when present, else CPU (fp32)."""
        from envhub.trainer.models import load_model

        net, tokenizer = load_model(model, device=device)
        return cls(net, tokenizer, **kwargs)

    @property
    def num_running(self) -> int:
        """Requests in the decode batch."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission or being prefilled."""
        return len(self._waiting) + len(self._prefilling)

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        *,
        rid: str | None = None,
        resubmit_aborted: bool = True,
        on_token: Any = None,
    ) -> GenerateResult:
        """Continue `input_ids`. With `resubmit_aborted`, requests interrupted by a pause/weight update continue after
        it."""
        if self._closed:
            raise EngineError("the engine is closed")
        self._validate(input_ids, sampling)
        loop = asyncio.get_running_loop()
        request = _Request(
            rid or f"local-{next(_ids)}",
            list(input_ids),
            sampling,
            loop.create_future(),
            resubmit_aborted,
            on_token=on_token,
        )
        if sampling.max_new_tokens <= 0:
            request.finish = "length"
            return self._result(request)
        self._bind_loop()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run(), name="local-engine-scheduler")
        self._waiting.append(request)
        self._wake.set()
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            await self.abort(request.rid)
            raise

    def _bind_loop(self) -> None:
        """Serve from the running event loop; an idle engine may move to a new loop (e.g. a second asyncio.run)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if (
            self._loop is not None
            and not self._loop.is_closed()
            and (self._running or self._waiting or self._prefilling)
        ):
            raise EngineError("the engine is busy in another event loop", hint="use one event loop per engine")
        self._loop, self._loop_task = loop, None
        self._lock, self._wake = asyncio.Lock(), asyncio.Event()

    def _validate(self, input_ids: list[int], sampling: SamplingParams) -> None:
        if not input_ids:
            raise EngineError("input_ids is empty", hint="pass at least one prompt token")
        bad = [t for t in input_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise EngineError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        if len(input_ids) >= self.max_positions:
            raise EngineError(f"prompt of {len(input_ids)} tokens does not fit the context of {self.max_positions}")
        if sampling.top_p <= 0 or sampling.top_p > 1:
            raise EngineError(f"top_p must be in (0, 1], got {sampling.top_p}")

    async def _run(self) -> None:
        """Scheduler: while there is work and no pause, run one step at a time in a worker thread."""
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            while not self._closed and not self._paused and (self._waiting or self._running or self._prefilling):
                async with self._lock:
                    if self._paused:
                        break
                    room = self.max_batch_size - len(self._running) - len(self._prefilling)
                    self._prefilling += self._waiting[:room]
                    self._waiting = self._waiting[room:]
                    try:
                        finished = await asyncio.to_thread(self._step)
                    except Exception as exc:  # a failed step (e.g. out of memory) fails its requests, not the engine
                        finished = self._fail(exc)
                for request in finished:
                    self._resolve(request)
                await asyncio.sleep(0)  # let new requests, aborts and pauses in between steps

    def _step(self) -> list[_Request]:
        """One prefill step (alternating with decode while rows run), else one decode step; returns finished
        requests."""
        with torch.inference_mode():
            if self._prefilling and (not self._running or not self._decode_due):
                self._decode_due = True
                if self._running:
                    self.stats._prefills_in_a_row += 1
                    self.stats.max_prefills_between_decodes = max(
                        self.stats.max_prefills_between_decodes, self.stats._prefills_in_a_row
                    )
                rows, logits = self._prefill_step()
                if not rows:
                    return []
            else:
                self._decode_due = False
                self.stats._prefills_in_a_row = 0
                rows = self._running
                logits = self._batch.decode(self.model, [r.output_ids[-1] for r in rows])
                self.stats.decode_steps += 1
                self.stats.decode_rows += len(rows)
            self.stats.max_rows = max(self.stats.max_rows, len(self._running))
            tokens, logprobs = sample_next(
                logits,
                [r.sampling for r in rows],
                [r.generator for r in rows],
                [r.output_ids for r in rows],
                [self._stop_ids(r.sampling) for r in rows],
            )
        for request, token, logprob in zip(rows, tokens, logprobs):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            request.versions.append(self.version)
            request.finish = self._finish_reason(request)
            if request.on_token is not None:
                request.on_token(token, logprob, self.version)
        self.stats.tokens += len(rows)
        return self._drop_rows(lambda r: r.finish is not None)

    def _prefill_step(self) -> tuple[list[_Request], torch.Tensor]:
        """Prefill up to `prefill_chunk` new tokens of the admitted requests, reusing cached prefixes.

        Requests whose whole context is now in KV join the decode batch; returns them with their next-token logits.
        """
        budget = self.prefill_chunk if self.prefill_chunk > 0 else 1 << 62
        chosen, pieces = [], []
        for request in self._prefilling:
            if budget <= 0:
                break
            if request.generator is None and request.sampling.seed is not None:
                request.generator = torch.Generator(device=self.model.device).manual_seed(request.sampling.seed)
            context = request.context()
            if request.past is None:
                request.past_len, request.past = self.prefix_cache.match(context)
                self.stats.reused_tokens += request.past_len
            piece = context[request.past_len : request.past_len + budget]
            budget -= len(piece)
            chosen.append(request)
            pieces.append(piece)
        batch, logits = DecodeBatch.prefill(self.model, pieces, self.pad_id, [r.past for r in chosen])
        self.stats.prefill_steps += 1
        self.stats.prefill_tokens += sum(len(p) for p in pieces)
        done = []
        for row, (request, piece) in enumerate(zip(chosen, pieces)):
            request.past_len += len(piece)
            if request.past_len == len(request.context()):
                request.past, request.past_len = None, 0
                done.append(row)
            else:  # more chunks to go: keep this row's KV aside until its next turn
                request.past = batch.row_kv(row)
        finished_ids = {id(chosen[i]) for i in done}
        self._prefilling = [r for r in self._prefilling if id(r) not in finished_ids]
        if not done:
            return [], logits[:0]
        if len(done) < len(chosen):
            batch.keep(done)
        if self._batch is None:
            self._batch = batch
        else:
            self._batch.merge(batch)
        rows = [chosen[i] for i in done]
        self._running.extend(rows)
        return rows, logits[torch.tensor(done, device=logits.device)]

    def _fail(self, exc: Exception) -> list[_Request]:
        """Fail every request of a step that raised, and drop the batch."""
        failed = list(dict.fromkeys(self._running + self._prefilling))
        self._running, self._prefilling, self._batch = [], [], None
        error = EngineError(f"generation step failed: {type(exc).__name__}: {exc}")
        for request in failed:
            if not request.future.done():
                request.future.set_exception(error)
        return []

    def _stop_ids(self, sampling: SamplingParams) -> set[int]:
        """Tokens that end this request (EOS unless ignore_eos, plus its stop_token_ids)."""
        return set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else set(self.eos_token_ids))

    def _finish_reason(self, request: _Request) -> FinishReason | None:
        token, sampling = request.output_ids[-1], request.sampling
        if token in self._stop_ids(sampling) and len(request.output_ids) >= sampling.min_new_tokens:
            return "stop"
        if sampling.stop and self.tokenizer is not None:
            longest = max(len(s) for s in sampling.stop)
            tail = self.tokenizer.decode(request.output_ids[-(longest + 2) :])
            if any(s in tail for s in sampling.stop):
                return "stop"
        if len(request.output_ids) >= sampling.max_new_tokens or len(request.context()) >= self.max_positions:
            return "length"
        return None

    def _drop_rows(self, predicate: Any) -> list[_Request]:
        """Remove running requests matching `predicate` from the batch; returns them."""
        dropped = [r for r in self._running if predicate(r)]
        if dropped:
            for row, request in enumerate(self._running):
                # the row holds the request's context minus the newest token: reusable by its next turn
                if predicate(request) and int(self._batch.lengths[row]) == len(request.context()) - 1:
                    self.prefix_cache.put(request.context()[:-1], self._batch.row_kv(row))
            keep = [i for i, r in enumerate(self._running) if not predicate(r)]
            self._running = [self._running[i] for i in keep]
            if keep:
                self._batch.keep(keep)
            else:
                self._batch = None
        return dropped

    def _resolve(self, request: _Request) -> None:
        if not request.future.done():
            request.future.set_result(self._result(request))

    def _result(self, request: _Request) -> GenerateResult:
        meta = {
            "rid": request.rid,
            "prompt_tokens": len(request.prompt_ids),
            "completion_tokens": len(request.output_ids),
        }
        if request.retracts:
            meta["retracts"] = request.retracts
        return GenerateResult(
            output_ids=list(request.output_ids),
            logprobs=list(request.logprobs),
            finish_reason=request.finish or "abort",
            weight_version=request.versions[-1] if request.versions else self.version,
            meta=meta,
            token_versions=list(request.versions),
        )

    def _interrupt(self, reason: Literal["user", "system"], rid: str | None = None) -> int:
        """Stop running and waiting requests (all, or the one with `rid`); call with the lock held.

        "system" interruptions (pause, weight update) send resubmittable requests back to the queue.
        """

        def hit(r: _Request) -> bool:
            return rid is None or r.rid == rid

        stopped = self._drop_rows(hit) + [r for r in self._prefilling + self._waiting if hit(r)]
        self._waiting = [r for r in self._waiting if not hit(r)]
        self._prefilling = [r for r in self._prefilling if not hit(r)]
        for request in stopped:
            request.past, request.past_len = None, 0
        requeue = []
        for request in stopped:
            if reason == "system" and request.resubmit:
                request.retracts += 1
                requeue.append(request)
            else:
                request.finish = "abort"
                self._resolve(request)
        self._waiting = requeue + self._waiting
        return len(stopped)

    async def abort(self, rid: str | None = None) -> int:
        """Abort one request (by rid) or all; they return finish_reason "abort" with their tokens so far."""
        async with self._lock:
            return self._interrupt("user", rid)

    async def pause(self, mode: PauseMode = "in_place") -> None:
        """Stop stepping. in_place keeps the batch; retract requeues it; abort ends it (resubmittable ones requeue)."""
        self._paused = True
        async with self._lock:
            if mode == "retract":
                retracted = self._drop_rows(lambda r: True) + self._prefilling
                self._prefilling = []
                for request in retracted:
                    request.retracts += 1
                    request.past, request.past_len = None, 0
                self._waiting = retracted + self._waiting
            elif mode == "abort":
                self._interrupt("system")
            elif mode != "in_place":
                raise EngineError(f"unknown pause mode {mode!r}", hint="use abort, retract or in_place")

    async def resume(self) -> None:
        """Admit and step requests again."""
        self._paused = False
        self._wake.set()

    async def update_weights(
        self, path_or_state: Any, version: int | None = None, *, abort_all_requests: bool = False
    ) -> None:
        """Copy new weights into the model between two steps; the version becomes `version` or the old one + 1.

        Running requests keep their KV cache and continue under the new weights (each token records the version
        that sampled it); with `abort_all_requests` they are interrupted instead (resubmitted or returned as abort).
        """
        async with self._lock:
            if abort_all_requests:
                self._interrupt("system")
            await asyncio.to_thread(load_state, self.model, path_or_state)
            self.prefix_cache.clear()  # KV computed under the old weights
            for request in self._prefilling:
                request.past, request.past_len = None, 0
            self.version = self.version + 1 if version is None else int(version)
        self._wake.set()

    async def flush_cache(self, ignore_waiting: bool = False) -> bool:
        """Drop the prefix cache when idle; False (nothing flushed) while requests run, as SGLang refuses then.
        `ignore_waiting`: queued requests hold no KV and do not count (SGLang ignores them while paused)."""
        if self._running or self._prefilling or (self._waiting and not ignore_waiting):
            return False
        self.prefix_cache.clear()
        return True

    async def health(self) -> bool:
        """True while the engine is open and its scheduler has not crashed."""
        task = self._loop_task
        if self._closed or (task is not None and task.done() and not task.cancelled() and task.exception() is not None):
            return False
        return True

    async def close(self) -> None:
        """Abort everything and stop the scheduler."""
        if self._closed:
            return
        async with self._lock:
            self._interrupt("user")
            self._closed = True
        self._wake.set()
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except (asyncio.CancelledError, Exception):
                pass
