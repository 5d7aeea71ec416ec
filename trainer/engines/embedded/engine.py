"""EmbeddedEngine: a transformers model served in-process, continuous batching, logprobs, in-place weight updates.

An asyncio loop admits waiting requests between steps and runs each step (a prefill chunk of the newcomers, or
one decode step of every running row) on the engine's own compute thread, which does all of its torch work
(`ComputeThread`: why one thread matters on a CPU). The parts, each in its own module: `Scheduler` (queues,
admission under the KV budget, prefill/decode choice), `KVCache` (preallocated keys/values per slot),
`ModelRunner` (the forward pass over the cache), `DecodeStep` (CUDA graphs on GPU), `sampler` (tokens and
behaviour logprobs) and `PrefixCache` (KV of earlier turns, so the next turn of an episode prefills only its new
tokens). Logprobs: see `envhub.trainer.engines.embedded.sampler`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, Literal

import torch

from envhub.errors import EngineError
from envhub.inference import FinishReason, GenerateResult, InferenceEngine, SamplingParams
from envhub.trainer.engines.embedded.compute_thread import ComputeThread
from envhub.trainer.engines.embedded.decode_step import DecodeStep
from envhub.trainer.engines.embedded.hardware import (
    engine_dtype,
    fix_malloc_mmap_threshold,
    release_openmp_workers,
    trim_heap,
)
from envhub.trainer.engines.embedded.kv_cache import KVCache
from envhub.trainer.engines.embedded.model_runner import ModelRunner, kv_layout
from envhub.trainer.engines.embedded.prefix_cache import PrefixCache
from envhub.trainer.engines.embedded.projections import PackedProjections
from envhub.trainer.engines.embedded.sampler import sample_next
from envhub.trainer.engines.embedded.scheduler import IDLE_PREFILL_TOKENS, EngineStats, Request, Scheduler
from envhub.trainer.engines.embedded.threads import apply_threads, threads_setting
from envhub.trainer.engines.weights import load_state

TRIM_EVERY_STEPS = 128  # steps between two trims of the heap (hardware.trim_heap: 3-9 ms each here)

__all__ = ["EngineStats", "EmbeddedEngine", "PauseMode"]

PauseMode = Literal["abort", "retract", "in_place"]
_ids = itertools.count()


class EmbeddedEngine(InferenceEngine):
    """Serves a Llama-family transformers model on CPU or GPU; greedy output equals `model.generate`'s.

    `dtype` casts the model in place ("auto": bf16 where the device has bf16 units, else fp32; None keeps its
    dtype). `kv_cache_mb` bounds the KV cache: requests wait while it is full and one that could never fit is
    refused. `cuda_graphs` (default: on for CUDA) replays the decode step from captured graphs. `threads` (CPU):
    the torch threads of each model step, "auto" (`ThreadRule`: the free cores, re-read every step), a number, a
    callable, or 0 for torch's own count. `pack_weights` (None: where supported, CPU bf16) multiplies with
    oneDNN-packed copies of the projection weights, re-packed whenever a parameter changes (`projections.py`).
    `priority`: nice levels above the process's own for the compute thread and its OpenMP workers, where the
    process may raise priority (root or CAP_SYS_NICE); 0 = the process's (docs/engines.md, "Sharing the cores").
    """

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
        dtype: Any = None,
        kv_cache_mb: float = 2048.0,
        cuda_graphs: bool | None = None,
        threads: Any = "auto",
        pack_weights: bool | None = None,
        native_decode: bool | None = None,
        priority: int = 5,
        pack_prefill: bool = False,
    ) -> None:
        device = next(model.parameters()).device
        if dtype is not None:
            model = model.to(engine_dtype(dtype, device))
        self.model = model.eval()
        self.tokenizer = tokenizer
        fix_malloc_mmap_threshold()
        self.version = version
        if eos_token_ids is None:
            eos = getattr(model.generation_config, "eos_token_id", None) or getattr(tokenizer, "eos_token_id", None)
            eos_token_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        self.eos_token_ids = eos_token_ids
        self.pad_id = eos_token_ids[0] if eos_token_ids else 0
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        graphs = device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.cache = KVCache(
            kv_layout(model),
            int(kv_cache_mb * 2**20),
            max_rows=max_batch_size,
            max_tokens=self.max_positions,
            static=graphs,
        )
        self.threads = threads_setting(threads) if device.type == "cpu" else None
        self.runner = ModelRunner(
            model, self.cache, packed=pack_weights, native_decode=native_decode, pack_prefill=pack_prefill
        )
        self.decode_step = DecodeStep(self.runner, graphs=graphs)
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20))
        self.scheduler = Scheduler(
            self.cache,
            self.prefix_cache,
            max_batch_size=max_batch_size,
            prefill_chunk=prefill_chunk,
            # a burst in one big step on a GPU; on a CPU chunk by chunk (32 x 256 tokens: 918 tokens/s in one step,
            # ~3400 in 512-token steps, on 2 cores)
            burst_chunk=IDLE_PREFILL_TOKENS if device.type == "cuda" else prefill_chunk,
        )
        self.stats = self.scheduler.stats
        self._paused = False
        self._closed = False
        self._lock = asyncio.Lock()  # held for each step and for every change to the running batch
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._compute = ComputeThread("local-engine", priority=priority)
        release_openmp_workers()  # this thread cast the weights; from now on the compute thread computes

    @classmethod
    def from_pretrained(
        cls, model: str = "smollm2", device: str | None = None, dtype: Any = "auto", **kwargs: Any
    ) -> EmbeddedEngine:
        """An engine over "smollm2", "tiny" or a local HF directory, on CUDA when present, else CPU."""
        from envhub.trainer.models import load_model, pick_device

        net, tokenizer = load_model(model, device=device, dtype=engine_dtype(dtype, pick_device(device)))
        return cls(net, tokenizer, **kwargs)

    def describe(self) -> str:
        """How this engine computes, in one line (a training run prints it at start)."""
        packed = isinstance(self.runner.projections, PackedProjections)
        return (
            f"embedded engine: {self.runner.device.type}, {str(self.cache.layout.dtype).removeprefix('torch.')}, "
            f"projections {'packed (oneDNN)' if packed else 'as modules'}, decode attention: "
            f"{self.runner.decode_attention}" + (", prefill packed" if self.runner.pack_prefill else "")
        )

    @property
    def max_batch_size(self) -> int:
        """Most requests decoded together."""
        return self.scheduler.max_batch_size

    @property
    def num_running(self) -> int:
        """Requests in the decode batch."""
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission or being prefilled."""
        return len(self.scheduler.waiting) + len(self.scheduler.prefilling)

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
        request = Request(
            rid or f"local-{next(_ids)}",
            list(input_ids),
            sampling,
            loop.create_future(),
            resubmit_aborted,
            stop_ids=frozenset(sampling.stop_token_ids) | frozenset(() if sampling.ignore_eos else self.eos_token_ids),
            reservation=self._reservation(input_ids, sampling),
            on_token=on_token,
        )
        if sampling.max_new_tokens <= 0:
            request.finish = "length"
            return self._result(request)
        self._bind_loop()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run(), name="local-engine-scheduler")
        self.scheduler.waiting.append(request)
        self._wake.set()
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            await self.abort(request.rid)
            raise

    def _reservation(self, input_ids: list[int], sampling: SamplingParams) -> int:
        return min(len(input_ids) + max(sampling.max_new_tokens, 1), self.max_positions)

    def _bind_loop(self) -> None:
        """Serve from the running event loop; an idle engine may move to a new loop (e.g. a second asyncio.run)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed() and self.scheduler.busy:
            raise EngineError("the engine is busy in another event loop", hint="use one event loop per engine")
        self._loop, self._loop_task = loop, None
        self._lock, self._wake = asyncio.Lock(), asyncio.Event()
        release_openmp_workers()  # the loop's thread only serves; the compute thread computes

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
        need = self._reservation(input_ids, sampling)
        if not self.cache.fits(1, need):
            raise EngineError(
                f"request needs KV cache for {need} tokens (prompt {len(input_ids)} + max_new_tokens "
                f"{sampling.max_new_tokens}), more than engine.kv_cache_mb ({self.cache.max_bytes / 2**20:.0f} MiB) "
                f"holds: {self.cache.tokens_per_row(1)} tokens",
                hint="raise engine.kv_cache_mb, or lower max_new_tokens / shorten the prompt",
            )

    async def _run(self) -> None:
        """Scheduler loop: while there is work and no pause, run one step at a time in a worker thread."""
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            while not self._closed and not self._paused and self.scheduler.busy:
                async with self._lock:
                    if self._paused:
                        break
                    try:
                        finished = await self._compute.run(self._step)
                    except Exception as exc:  # a failed step (e.g. out of memory) fails its requests, not the engine
                        finished = await self._fail(exc)
                for request in finished:
                    self._resolve(request)
                await asyncio.sleep(0)  # let new requests, aborts and pauses in between steps

    def _step(self) -> list[Request]:
        """Admit, then one prefill chunk (alternating with decode while rows run) or one decode step; sample one
        token per row that got logits; returns finished requests."""
        scheduler, started = self.scheduler, time.perf_counter()
        if self.threads is not None:
            scheduler.stats.thread_changes += apply_threads(self.threads())
        with torch.inference_mode():
            scheduler.admit()
            prefill = scheduler.prefill_due()
            if prefill:
                first, pieces = scheduler.prefill_plan()
                logits = self.runner.prefill(first, pieces, self.pad_id)
                rows = scheduler.prefilled(pieces)
                if not rows:
                    return []
                logits = logits[: len(rows)]
            elif scheduler.running:
                rows = scheduler.decoded()
                logits = self.decode_step([r.output_ids[-1] for r in rows])
            else:  # admitted nothing (the budget is full of waiting requests' predecessors): nothing to run
                return []
            tokens, logprobs = sample_next(
                logits,
                [r.sampling for r in rows],
                [r.generator for r in rows],
                [r.output_ids for r in rows],
                [r.stop_ids for r in rows],
            )
        stats = scheduler.stats
        if (stats.prefill_steps + stats.decode_steps) % TRIM_EVERY_STEPS == 0:
            trim_heap()  # free pages between the heap's live blocks back to the OS (hardware.trim_heap)
        version = self.version
        for request, token, logprob in zip(rows, tokens, logprobs):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            request.versions.append(version)
            request.finish = self._finish_reason(request)
            if request.on_token is not None:
                request.on_token(token, logprob, version)
        scheduler.stats.tokens += len(rows)
        if prefill:
            scheduler.stats.prefill_s += time.perf_counter() - started
        else:
            scheduler.stats.decode_s += time.perf_counter() - started
        if not any(r.finish is not None for r in rows):
            return []
        with torch.inference_mode():
            return scheduler.remove(lambda r: r.finish is not None)

    def _remove(self, hit: Any, save_prefixes: bool = True) -> list[Request]:
        """Take the rows `hit` selects out of the batch (KV copies: call on the compute thread)."""
        with torch.inference_mode():
            return self.scheduler.remove(hit, save_prefixes=save_prefixes)

    async def _fail(self, exc: Exception) -> list[Request]:
        """Fail every live request of a step that raised, and empty the batch."""
        failed = await self._compute.run(self._remove, lambda r: True, False)
        error = EngineError(f"generation step failed: {type(exc).__name__}: {exc}")
        for request in failed:
            if not request.future.done():
                request.future.set_exception(error)
        return []

    def _finish_reason(self, request: Request) -> FinishReason | None:
        token, sampling = request.output_ids[-1], request.sampling
        if token in request.stop_ids and len(request.output_ids) >= sampling.min_new_tokens:
            return "stop"
        if sampling.stop and self.tokenizer is not None:
            longest = max(len(s) for s in sampling.stop)
            tail = self.tokenizer.decode(request.output_ids[-(longest + 2) :])
            if any(s in tail for s in sampling.stop):
                return "stop"
        if len(request.output_ids) >= sampling.max_new_tokens or len(request.context()) >= self.max_positions:
            return "length"
        return None

    def _resolve(self, request: Request) -> None:
        if not request.future.done():
            request.future.set_result(self._result(request))

    def _result(self, request: Request) -> GenerateResult:
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

    async def _interrupt(self, reason: Literal["user", "system"], rid: str | None = None) -> int:
        """Stop running and waiting requests (all, or the one with `rid`); call with the lock held.

        "system" interruptions (pause, weight update) send resubmittable requests back to the queue.
        """

        def hit(r: Request) -> bool:
            return rid is None or r.rid == rid

        scheduler = self.scheduler
        stopped = await self._compute.run(self._remove, hit) + [r for r in scheduler.waiting if hit(r)]
        scheduler.waiting = [r for r in scheduler.waiting if not hit(r)]
        requeue = []
        for request in stopped:
            if reason == "system" and request.resubmit:
                request.retracts += 1
                requeue.append(request)
            else:
                request.finish = "abort"
                self._resolve(request)
        scheduler.waiting = requeue + scheduler.waiting
        return len(stopped)

    async def abort(self, rid: str | None = None) -> int:
        """Abort one request (by rid) or all; they return finish_reason "abort" with their tokens so far."""
        async with self._lock:
            return await self._interrupt("user", rid)

    async def pause(self, mode: PauseMode = "in_place") -> None:
        """Stop stepping. in_place keeps the batch; retract requeues it; abort ends it (resubmittable ones requeue)."""
        self._paused = True
        async with self._lock:
            if mode == "retract":
                retracted = await self._compute.run(self._remove, lambda r: True)
                for request in retracted:
                    request.retracts += 1
                self.scheduler.waiting = retracted + self.scheduler.waiting
            elif mode == "abort":
                await self._interrupt("system")
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
                await self._interrupt("system")
            await self._compute.run(load_state, self.model, path_or_state)
            await self._compute.run(self.runner.projections.refresh)  # packed copies: made here, not at next step
            self.prefix_cache.clear()  # KV computed under the old weights
            self.scheduler.forget_partial_prefills()
            self.version = self.version + 1 if version is None else int(version)
        self._wake.set()

    async def flush_cache(self, ignore_waiting: bool = False) -> bool:
        """Drop the prefix cache when idle; False (nothing flushed) while requests run, as SGLang refuses then.
        `ignore_waiting`: queued requests hold no KV and do not count (SGLang ignores them while paused)."""
        scheduler = self.scheduler
        if scheduler.running or scheduler.prefilling or (scheduler.waiting and not ignore_waiting):
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
            await self._interrupt("user")
            self._closed = True
        self._wake.set()
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except (asyncio.CancelledError, Exception):
                pass
        self._compute.close()
