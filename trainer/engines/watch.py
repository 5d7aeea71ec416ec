"""An engine that may die: `WatchedEngine` rides out an inference server's outage, for a bounded time.

It wraps any `InferenceEngine` (the SGLang client, which also drives `envhub serve-engine`, the vLLM client,
a `MultiEngine` over several servers) and uses nothing but the contract: `generate`, `update_weights`, `health`.
- A call that fails while the engine is unhealthy, or that could not reach it at all (`EngineUnreachable`: a
  server restarted meanwhile answers again, with its initial weights), starts (or joins) one recovery: `health()`
  is polled with exponential backoff; requests wait meanwhile instead of hammering a dead server.
- When the engine answers again, the latest weights pushed through this wrapper are pushed again (a restarted
  server comes back with its initial weights) before anything else runs; then the waiting requests are
  resubmitted from their prompt (an episode keeps every turn it had finished) and counted (`resubmitted`).
- A background probe (`start_watch`, every `probe_interval_s`) meets outages that no request notices, e.g. a
  server restarted while the learner steps; a result labelled two or more versions below the last push also
  means the server lost its weights.
- An outage longer than `max_outage_s` (or a managed server that exited: the inner engine's `raise_if_failed`)
  ends it: every waiting call raises `EngineDown` naming the engine, so in-flight episodes end as engine errors
  (counted by `TaskErrors`) and the trainer stops with the checkpoint to resume from.
A failure while the engine is healthy (a 400, a bad request) is the request's own and is raised as it is.

With `failover=True` (one server among several behind a `MultiEngine`) nothing waits on this engine's outage:
a call meeting one starts the recovery and raises `EngineUnavailable` at once, so the MultiEngine resubmits it
on another server; a push during the outage is only remembered (the recovery pushes the latest one); and an
outage past `max_outage_s` marks this server lost (`lost`) without stopping the run while others serve.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from envhub.errors import EngineError, EngineUnreachable
from envhub.inference import GenerateResult, InferenceEngine, SamplingParams

PROBE_INTERVAL_S = 2.0  # background health probe period
PROBE_TIMEOUT_S = 10.0  # a health check that takes longer counts as "not answering"
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0


class EngineDown(EngineError):
    """An inference engine that stopped answering for longer than the run allows."""


class EngineUnavailable(EngineError):
    """A failover engine in an outage: the call was not run there, and another engine should take it."""


def engine_name(engine: Any) -> str:
    """The engine's URL(s), those of the servers inside a MultiEngine or an SGLangDeployment (its router, then its
    workers), or its class name for an in-process engine."""
    return ", ".join(_urls(engine)) or type(engine).__name__


def _urls(engine: Any) -> list[str]:
    url = getattr(engine, "url", None)
    if isinstance(url, str):
        return [url]
    parts = getattr(engine, "engines", None) or [getattr(engine, "router", None), getattr(engine, "workers", None)]
    return [u for part in parts if part is not None for u in _urls(part)]


class WatchedEngine(InferenceEngine):
    """`inner` with outages ridden out for up to `max_outage_s` seconds (see the module docstring)."""

    def __init__(
        self,
        inner: InferenceEngine,
        max_outage_s: float,
        probe_interval_s: float = PROBE_INTERVAL_S,
        failover: bool = False,
    ):
        self.inner = inner
        self.failover = failover
        self.max_outage_s = max_outage_s
        self.probe_interval_s = probe_interval_s
        self.outages = 0  #: outages met (each recovered or ended the run)
        self.resubmitted = 0  #: calls retried after an outage
        self.down_s = 0.0  #: seconds spent waiting for the engine
        self._down: EngineDown | None = None
        self._recovery: asyncio.Future[None] | None = None
        self._last_push: tuple[Any, int | None, dict[str, Any]] | None = None
        self._pushed_version = 0  # version of the last push that completed
        self._push_lock: asyncio.Lock | None = None
        self._watch: asyncio.Task[None] | None = None
        self._gave_up: asyncio.Event | None = None  # set with _down: calls stuck on a hung server are cut

    def __getattr__(self, name: str) -> Any:  # url, version, stats, abort, ... of the engine inside
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- the contract -----------------------------------------------------------------------------------
    async def generate(self, input_ids: list[int], sampling: SamplingParams, **kwargs: Any) -> GenerateResult:
        """Generate on the engine; through an outage, wait for it and resubmit (EngineDown when it stays down)."""
        while True:
            self._fail_over_if_unavailable()
            await self._wait_for_recovery()
            try:
                result = await self._unless_down(self.inner.generate(input_ids, sampling, **kwargs))
            except EngineDown:
                if self.failover:
                    raise EngineUnavailable(f"{engine_name(self.inner)} is lost") from None
                raise
            except Exception as exc:
                if self.failover and self.lost:  # e.g. a managed server that exited
                    raise EngineUnavailable(f"{engine_name(self.inner)} is lost: {exc}") from exc
                if not await self._outage(unreachable=isinstance(exc, EngineUnreachable)):
                    raise
                self.resubmitted += 1
                continue
            if result.weight_version < self._pushed_version - 1 and not self._recovering():
                self._start_recovery()  # restarted unseen: it serves old weights
            return result

    async def update_weights(self, path_or_state: Any, version: int | None = None, **kwargs: Any) -> None:
        """Push weights (remembered: a restarted server gets them again); through an outage, the recovery pushes."""
        push = (path_or_state, version, kwargs)
        if self.failover and (self._recovering() or self.lost):
            self._last_push = push  # the recovery pushes the latest; a lost server gets nothing more
            return
        self.raise_if_failed()
        try:
            await self._unless_down(self._push(push))
        except EngineDown:
            if not self.failover:
                raise
        except Exception as exc:
            if self.failover and self.lost:
                return
            try:
                if not await self._outage(unreachable=isinstance(exc, EngineUnreachable)):
                    raise
            except EngineUnavailable:  # failover: remembered, and pushed by the recovery it started
                self._last_push = push

    async def pause(self, **kwargs: Any) -> None:
        await self.inner.pause(**kwargs)

    async def resume(self) -> None:
        await self.inner.resume()

    async def health(self) -> bool:
        return await self.inner.health()

    def raise_if_failed(self) -> None:
        """Raise EngineDown once an outage outlasted `max_outage_s`, or the inner engine's own fatal error."""
        if self._down is not None:
            raise self._down
        self.inner.raise_if_failed()

    @property
    def available(self) -> bool:
        """Whether calls run on this engine now: no outage being ridden out, not lost."""
        return self._down is None and not self._recovering()

    @property
    def lost(self) -> bool:
        """Whether this engine is gone for the rest of the run (an outage outlasted max_outage_s, or it failed)."""
        if self._down is not None:
            return True
        try:
            self.inner.raise_if_failed()
        except Exception:
            return True
        return False

    async def recovered(self) -> None:
        """Return once the outage being ridden out is over (at once when there is none); never raises."""
        if self._recovering():
            assert self._recovery is not None
            await asyncio.wait([self._recovery])

    def _fail_over_if_unavailable(self) -> None:
        if self.failover and (not self.available or self.lost):
            raise EngineUnavailable(f"{engine_name(self.inner)} is {'lost' if self.lost else 'recovering'}")

    def metrics(self) -> dict[str, float]:
        """Outages, resubmitted calls and seconds spent waiting, for the step's metrics row (empty when none)."""
        if not self.outages:
            return {}
        return {"engine_outages": self.outages, "engine_resubmits": self.resubmitted, "engine_down_s": self.down_s}

    def start_watch(self) -> None:
        """Probe the engine's health every `probe_interval_s` in the background (call on the running loop)."""
        if self._watch is None:
            self._watch = asyncio.create_task(self._watch_forever())

    async def close(self) -> None:
        """Stop the probe and any recovery, and close the engine inside."""
        for task in (self._watch, self._recovery):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in (self._watch, self._recovery) if t is not None), return_exceptions=True)
        await self.inner.close()

    # -- outages ----------------------------------------------------------------------------------------
    async def _push(self, push: tuple[Any, int | None, dict[str, Any]]) -> None:
        self._push_lock = self._push_lock or asyncio.Lock()
        async with self._push_lock:  # one push at a time: a recovery's re-push never lands after a newer one
            self._last_push = push
            path_or_state, version, kwargs = push
            await self.inner.update_weights(path_or_state, version=version, **kwargs)
            self._pushed_version = version if version is not None else self._pushed_version + 1

    async def _unless_down(self, call: Any) -> Any:
        """Await `call`, cancelled with EngineDown if the recovery gives up meanwhile (a hung server)."""
        self._gave_up = self._gave_up or asyncio.Event()
        work, gave_up = asyncio.ensure_future(call), asyncio.ensure_future(self._gave_up.wait())
        try:
            await asyncio.wait({work, gave_up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gave_up.cancel()
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        if not work.done() or work.cancelled():
            self.raise_if_failed()
        return work.result()

    def _recovering(self) -> bool:
        return self._recovery is not None and not self._recovery.done()

    async def _wait_for_recovery(self) -> None:
        self.raise_if_failed()
        if self._recovering():
            assert self._recovery is not None
            await asyncio.shield(self._recovery)

    async def _outage(self, unreachable: bool = False) -> bool:
        """After a failed call: False when the engine is healthy (the failure was the call's own); True once the
        outage is over (waiting for it, or joining the recovery already running); EngineDown when it lasts.
        A call that never reached the engine (`unreachable`) met an outage even when the engine is healthy now:
        it may have been restarted meanwhile, so the recovery runs and gives it the latest weights again."""
        self.raise_if_failed()
        if not self._recovering():
            if not unreachable and await self._healthy():
                return False
            if not self._recovering():  # another call may have started one while this one probed
                self._start_recovery()
        assert self._recovery is not None
        if self.failover:  # another engine takes the call; this one recovers on its own
            raise EngineUnavailable(f"{engine_name(self.inner)} stopped answering")
        await asyncio.shield(self._recovery)
        return True

    def _start_recovery(self) -> None:
        self._recovery = asyncio.ensure_future(self._recover())
        # its EngineDown is kept in self._down for every later call, even when no call was waiting for it
        self._recovery.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def _healthy(self) -> bool:
        try:
            return bool(await asyncio.wait_for(self.inner.health(), PROBE_TIMEOUT_S))
        except Exception:  # a health check that fails or hangs: not answering
            return False

    async def _recover(self) -> None:
        """Poll health with backoff until the engine answers and has the latest weights again, or give up."""
        started = time.monotonic()
        self.outages += 1
        delay = FIRST_BACKOFF_S
        try:
            while True:
                self.raise_if_failed()
                left = self.max_outage_s - (time.monotonic() - started)
                if await self._healthy() and await self._repush(timeout=max(left, PROBE_TIMEOUT_S)):
                    return
                left = self.max_outage_s - (time.monotonic() - started)
                if left <= 0:
                    self._down = EngineDown(
                        f"the inference engine at {engine_name(self.inner)} stopped answering and was not back "
                        f"within {self.max_outage_s:g} s",
                        hint="restart the engine, then resume; engine.max_outage_s sets how long a run waits",
                    )
                    if self._gave_up is not None:
                        self._gave_up.set()
                    raise self._down
                await asyncio.sleep(min(delay, left))
                delay = min(2 * delay, MAX_BACKOFF_S)
        finally:
            self.down_s += time.monotonic() - started

    async def _repush(self, timeout: float) -> bool:
        """Give a restarted engine the latest weights; False while it cannot take them yet."""
        while self._last_push is not None:
            push = self._last_push
            try:  # bounded: a push stuck on a hung server must not outlast max_outage_s
                await asyncio.wait_for(self._push(push), timeout)
            except Exception:
                return False
            if self._last_push is push:  # else a newer push came (and was only remembered) meanwhile: send it
                return True
        return True

    async def _watch_forever(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            try:
                await self._outage()  # nothing happens while the engine is healthy
            except EngineUnavailable:  # failover: the recovery it started runs on its own
                await self.recovered()
            except Exception:  # EngineDown or a fatal error: kept for raise_if_failed, the trainer stops on it
                return
