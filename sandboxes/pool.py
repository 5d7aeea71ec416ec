"""`SandboxPool`: warm spares, back-pressure, a fresh sandbox for every acquire, orphan cleanup, metrics.

A released sandbox is destroyed, never reused: the next user gets a warm spare that no episode has
touched, and the pool refills its spares in the background.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from envhub.errors import SandboxError
from envhub.sandboxes.base import ImageLayout, Sandbox, SandboxLimits

log = logging.getLogger(__name__)
Backend = Literal["docker", "bwrap", "local"]


@dataclass(frozen=True)
class PoolMetrics:
    """A snapshot of a pool's counters and acquire latency percentiles (milliseconds)."""

    acquires: int
    acquire_p50_ms: float
    acquire_p99_ms: float
    in_use: int
    spares: int
    created: int
    failed: int
    destroyed: int
    cold_starts: int
    unhealthy: int
    start_p50_ms: float = 0.0  # creating one sandbox (container start), warm or cold
    start_p99_ms: float = 0.0
    size: int = 0  # warm spares the pool keeps
    max_size: int = 0  # sandboxes it hands out at once

    @property
    def hit_rate(self) -> float:
        """The share of acquires served by a warm spare (no sandbox started while the caller waited)."""
        return 1.0 - self.cold_starts / self.acquires if self.acquires else 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class SandboxPool:
    """A pool of ready sandboxes of one backend; `async with pool.acquire() as sb` hands out a clean one."""

    def __init__(
        self,
        backend: Backend = "docker",
        image: str | None = None,
        size: int = 4,
        max_size: int | None = None,
        limits: SandboxLimits | None = None,
        *,
        health_interval: float = 30.0,
        pool_id: str | None = None,
        layout: ImageLayout | None = None,
    ) -> None:
        if backend not in ("docker", "bwrap", "local"):
            raise SandboxError(f"unknown sandbox backend {backend!r}", hint="use 'docker', 'bwrap' or 'local'")
        if size < 0 or (max_size is not None and max_size < 1):
            raise SandboxError(f"bad pool sizes size={size} max_size={max_size}", hint="size >= 0 and max_size >= 1")
        self.backend = backend
        self.image = image
        self.size = size
        self.max_size = max_size if max_size is not None else max(size, 1)
        self.limits = limits or SandboxLimits()
        self.layout = layout
        self.health_interval = health_interval
        self.pool_id = pool_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._spares: asyncio.Queue[tuple[float, Sandbox]] = asyncio.Queue()
        self._slots = asyncio.Semaphore(self.max_size)
        self._in_use: set[Sandbox] = set()
        self._pending = 0
        self._tasks: set[asyncio.Task] = set()
        self._latencies: list[float] = []
        self._start_times: list[float] = []
        self._counts = {"created": 0, "failed": 0, "destroyed": 0, "cold_starts": 0, "unhealthy": 0}
        self._started = False
        self._closed = False

    async def start(self) -> SandboxPool:
        """Remove orphans of crashed processes, check the image, and warm `size` spares."""
        if self._started:
            return self
        if self.backend == "docker":
            from envhub.sandboxes.docker_backend import remove_orphans
            from envhub.sandboxes.images import image_exists, require_base_image

            removed = await asyncio.to_thread(remove_orphans)
            if removed:
                log.info("removed %d orphaned sandbox containers", len(removed))
            if self.image is None:
                self.image = await asyncio.to_thread(require_base_image)
            elif not await asyncio.to_thread(image_exists, self.image):
                raise SandboxError(
                    f"image {self.image} missing",
                    hint="run `envhub sandbox build` (images are built locally, never pulled)",
                )
        elif self.backend == "bwrap":
            from envhub.sandboxes.bwrap_backend import check_bwrap, remove_orphan_dirs

            await asyncio.to_thread(check_bwrap)
            await asyncio.to_thread(remove_orphan_dirs)
        self._started = True
        atexit.register(self._cleanup_at_exit)  # pools that are never closed leave nothing behind
        self._pending += self.size
        outcomes = await asyncio.gather(*(self._add_spare() for _ in range(self.size)), return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if self.size and self._spares.empty():
            await self.close()
            raise (
                errors[0]
                if isinstance(errors[0], SandboxError)
                else SandboxError(f"could not start any {self.backend} sandbox: {errors[0]}")
            )
        return self

    def _new_sandbox(self) -> Sandbox:
        if self.backend == "docker":
            from envhub.sandboxes.docker_backend import LABEL_POOL, DockerSandbox

            return DockerSandbox(self.image, limits=self.limits, labels={LABEL_POOL: self.pool_id}, layout=self.layout)
        if self.backend == "bwrap":
            from envhub.sandboxes.bwrap_backend import BwrapSandbox

            return BwrapSandbox(self.image, limits=self.limits)
        from envhub.sandboxes.local import LocalSandbox

        return LocalSandbox(limits=self.limits, allow_unsafe=True)

    async def _create(self) -> Sandbox:
        sandbox = self._new_sandbox()
        started = time.perf_counter()
        try:
            await sandbox.start()
        except BaseException:
            self._counts["failed"] += 1
            with contextlib.suppress(Exception):
                await sandbox.close()
            raise
        self._counts["created"] += 1
        self._start_times.append(time.perf_counter() - started)
        return sandbox

    async def _add_spare(self) -> None:
        """Create one spare; the caller has already counted it in `_pending`."""
        try:
            sandbox = await self._create()
        except Exception as exc:
            log.warning("sandbox creation failed: %s", exc)
            raise
        finally:
            self._pending -= 1
        if self._closed:
            await sandbox.close()
            return
        self._spares.put_nowait((time.monotonic(), sandbox))

    def _refill(self) -> None:
        missing = self.size - self._spares.qsize() - self._pending
        for _ in range(max(missing, 0)):
            self._pending += 1
            self._spawn(self._add_spare())

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("pool background task failed: %s", task.exception())

    async def _take(self) -> Sandbox:
        while not self._spares.empty():
            since, sandbox = self._spares.get_nowait()
            if not await self._usable(sandbox, since):
                self._counts["unhealthy"] += 1
                self._spawn(self._destroy(sandbox))
                continue
            return sandbox
        self._counts["cold_starts"] += 1
        return await self._create()

    async def _usable(self, sandbox: Sandbox, since: float) -> bool:
        """Whether a spare may be handed out: not dead, its container still running (checked on every take: a Docker
        daemon restart stops them all, and the pool then rebuilds its spares), answering once past health_interval."""
        if getattr(sandbox, "dead", False):
            return False
        running = getattr(sandbox, "running", None)
        if running is not None and not await running():
            return False
        return time.monotonic() - since <= self.health_interval or await sandbox.healthy()

    async def _destroy(self, sandbox: Sandbox) -> None:
        try:
            await sandbox.close()
        finally:
            self._counts["destroyed"] += 1

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Sandbox]:
        """A clean sandbox for one episode; waits while `max_size` are in use; destroyed on release."""
        if not self._started:
            await self.start()
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        started = time.perf_counter()
        await self._slots.acquire()
        try:
            sandbox = await self._take()
        except BaseException:
            self._slots.release()
            raise
        finally:
            self._refill()
        self._latencies.append(time.perf_counter() - started)
        self._in_use.add(sandbox)
        try:
            yield sandbox
        finally:
            self._in_use.discard(sandbox)
            self._slots.release()
            self._spawn(self._destroy(sandbox))
            self._refill()

    async def resize(self, size: int) -> None:
        """Keep `size` warm spares from now on: surplus spares are destroyed, missing ones started in the background."""
        self.size = max(size, 0)
        while self._spares.qsize() > self.size:
            self._spawn(self._destroy(self._spares.get_nowait()[1]))
        if self._started and not self._closed:
            self._refill()

    def metrics(self) -> PoolMetrics:
        """Counters and acquire latency percentiles so far."""
        lat = self._latencies[-10_000:]
        return PoolMetrics(
            acquires=len(self._latencies),
            acquire_p50_ms=_percentile(lat, 0.50) * 1000,
            acquire_p99_ms=_percentile(lat, 0.99) * 1000,
            in_use=len(self._in_use),
            spares=self._spares.qsize(),
            **self._counts,
            start_p50_ms=_percentile(self._start_times[-10_000:], 0.50) * 1000,
            start_p99_ms=_percentile(self._start_times[-10_000:], 0.99) * 1000,
            size=self.size,
            max_size=self.max_size,
        )

    async def close(self) -> None:
        """Destroy every spare and in-use sandbox and wait for background work."""
        self._closed = True
        atexit.unregister(self._cleanup_at_exit)
        pending = list(self._tasks)
        await asyncio.gather(*pending, return_exceptions=True)
        sandboxes = list(self._in_use)
        while not self._spares.empty():
            sandboxes.append(self._spares.get_nowait()[1])
        await asyncio.gather(*(self._destroy(sb) for sb in sandboxes), return_exceptions=True)
        if self.backend == "docker" and self._started:
            from envhub.sandboxes.docker_backend import remove_orphans

            await asyncio.to_thread(remove_orphans, pool_id=self.pool_id)

    def _cleanup_at_exit(self) -> None:
        """Synchronously remove what an unclosed pool still holds when the interpreter exits."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            if self.backend == "docker":
                from envhub.sandboxes.docker_backend import remove_orphans

                remove_orphans(pool_id=self.pool_id)
            elif self.backend == "bwrap":
                from envhub.sandboxes.bwrap_backend import BwrapSandbox

                held = list(self._in_use) + [entry[1] for entry in list(self._spares._queue)]
                for sandbox in held:
                    if isinstance(sandbox, BwrapSandbox):
                        sandbox._teardown()

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
