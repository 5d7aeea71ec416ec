"""`MultiImagePool`: sandboxes from many images (one per SWE instance) under one budget of warm spares.

Each image gets its own `SandboxPool`. Recently used images keep `spares_per_image` warm spares (`prewarm`
adds more for an image about to be used; each acquire uses one of those up); when the
spares of all images would pass `spares_budget`, the least recently used images that are idle lose theirs
(LRU eviction). One global bound, `max_in_use`, caps the sandboxes running at once across every image.
Missing images are pulled when a registry answers, else one clear error says how to build or load them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from envhub.errors import SandboxError
from envhub.sandboxes.base import ImageLayout, Sandbox, SandboxLimits
from envhub.sandboxes.pool import Backend, SandboxPool, _percentile

PoolKey = tuple[str | None, ImageLayout | None]


@dataclass(frozen=True)
class MultiPoolMetrics:
    """Counters across every image: acquires, warm hits, sandbox start latency, evictions, image pulls."""

    images: int
    acquires: int
    hits: int
    cold_starts: int
    acquire_p50_ms: float
    acquire_p99_ms: float
    start_p50_ms: float
    start_p99_ms: float
    spares: int
    in_use: int
    evictions: int
    pulls: int

    @property
    def hit_rate(self) -> float:
        """The share of acquires served by a warm spare."""
        return self.hits / self.acquires if self.acquires else 0.0


class MultiImagePool:
    """`async with pools.acquire(image, layout) as sb`: a fresh sandbox of `image`, warm when recently used."""

    def __init__(
        self,
        backend: Backend = "docker",
        *,
        spares_budget: int = 8,
        spares_per_image: int = 1,
        max_in_use: int = 16,
        limits: SandboxLimits | None = None,
        pull: bool = True,
        default_image: str | None = None,
    ) -> None:
        if spares_budget < 0 or spares_per_image < 0 or max_in_use < 1:
            raise SandboxError(
                f"bad pool sizes spares_budget={spares_budget} spares_per_image={spares_per_image} "
                f"max_in_use={max_in_use}",
                hint="spares >= 0 and max_in_use >= 1",
            )
        self.backend, self.limits, self.pull = backend, limits, pull
        self.spares_budget, self.spares_per_image, self.max_in_use = spares_budget, spares_per_image, max_in_use
        self.default_image = default_image
        self._pools: collections.OrderedDict[PoolKey, SandboxPool] = collections.OrderedDict()  # LRU first
        self._busy: collections.Counter[PoolKey] = collections.Counter()
        self._slots = asyncio.Semaphore(max_in_use)
        self._creating: dict[PoolKey, asyncio.Task] = {}
        self._latencies: list[float] = []
        self._evictions = 0
        self._pulls = 0
        self._closed = False

    async def _pool(self, key: PoolKey) -> SandboxPool:
        if key in self._pools:
            self._pools.move_to_end(key)
            return self._pools[key]
        task = self._creating.get(key)
        if task is None:  # one start per image, however many episodes ask at once; a failure is retried later
            task = self._creating[key] = asyncio.get_running_loop().create_task(self._start_pool(key))
            task.add_done_callback(lambda _t, k=key: self._creating.pop(k, None))
        return await asyncio.shield(task)

    async def _start_pool(self, key: PoolKey) -> SandboxPool:
        image, layout = key
        if self.backend == "docker" and image is not None:
            from envhub.sandboxes.images import ensure_image

            pulled = await asyncio.to_thread(ensure_image, image, pull=self.pull)
            self._pulls += int(pulled)
        elif image is not None and layout is not None:
            raise SandboxError(
                f"image {image} needs the docker backend",
                hint="use backend='docker' for instances with their own image",
            )
        pool = SandboxPool(
            self.backend, image=image, size=0, max_size=self.max_in_use, limits=self.limits, layout=layout
        )
        await pool.start()
        self._pools[key] = pool
        return pool

    async def _rebalance(self, current: PoolKey, want: int | None = None) -> None:
        """Give `current` its spares, taking them from idle least-recently-used images when over budget."""
        pool = self._pools[current]
        want = max(self.spares_per_image, pool.size) if want is None else want
        others = sum(p.size for k, p in self._pools.items() if k != current)
        for key, other in list(self._pools.items()):  # least recently used first
            if others + want <= self.spares_budget:
                break
            if key == current or other.size == 0 or self._busy[key]:
                continue
            others -= other.size
            self._evictions += 1
            await other.resize(0)
        target = max(min(want, self.spares_budget - others), 0)
        if pool.size != target:
            await pool.resize(target)

    @contextlib.asynccontextmanager
    async def acquire(self, image: str | None = None, layout: ImageLayout | None = None) -> AsyncIterator[Sandbox]:
        """A fresh sandbox of `image` (the default image when None); waits while `max_in_use` run."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        key: PoolKey = (image or self.default_image, layout)
        started = time.perf_counter()
        async with self._slots:
            pool = await self._pool(key)
            self._busy[key] += 1
            if pool.size > self.spares_per_image:
                pool.size -= 1  # a prewarmed spare is used up: it is not replaced
            try:
                async with pool.acquire() as sandbox:
                    self._latencies.append(time.perf_counter() - started)
                    await self._rebalance(key)
                    yield sandbox
            finally:
                self._busy[key] -= 1

    async def prewarm(self, image: str | None, layout: ImageLayout | None = None, count: int | None = None) -> None:
        """Start `count` spares of an image that is about to be used (e.g. the next GRPO group's instance)."""
        key: PoolKey = (image or self.default_image, layout)
        await self._pool(key)
        await self._rebalance(key, self.spares_per_image if count is None else count)

    def metrics(self) -> MultiPoolMetrics:
        """Totals across every image's pool."""
        per = [p.metrics() for p in self._pools.values()]
        starts = [t for p in self._pools.values() for t in p._start_times[-2000:]]
        acquires = sum(m.acquires for m in per)
        cold = sum(m.cold_starts for m in per)
        return MultiPoolMetrics(
            images=len(per),
            acquires=acquires,
            hits=acquires - cold,
            cold_starts=cold,
            acquire_p50_ms=_percentile(self._latencies, 0.5) * 1000,
            acquire_p99_ms=_percentile(self._latencies, 0.99) * 1000,
            start_p50_ms=_percentile(starts, 0.5) * 1000,
            start_p99_ms=_percentile(starts, 0.99) * 1000,
            spares=sum(m.spares for m in per),
            in_use=sum(m.in_use for m in per),
            evictions=self._evictions,
            pulls=self._pulls,
        )

    def spares_by_image(self) -> dict[str | None, int]:
        """Target warm spares per image, most recently used last."""
        return {image: pool.size for (image, _), pool in self._pools.items()}

    async def close(self) -> None:
        """Close every image's pool."""
        self._closed = True
        await asyncio.gather(*(p.close() for p in self._pools.values()), return_exceptions=True)

    async def __aenter__(self) -> MultiImagePool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
