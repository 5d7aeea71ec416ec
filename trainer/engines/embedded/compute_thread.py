"""ComputeThread: the one thread that runs an engine's torch work, so the CPU's cores run one OpenMP team.

Why one thread: torch's CPU kernels run in the OpenMP team of the thread that calls them, and GNU OpenMP keeps a
team of worker threads per calling thread for the life of that thread. Once a process holds more OpenMP threads
than there are CPUs, libgomp stops letting idle workers spin and puts them to sleep after every parallel region;
each of the ~400 small regions of a decode step then waits for its workers to wake. With the steps going through
`asyncio.to_thread`, the event loop's thread (which loaded the model) and every pool thread that ever ran a step
kept a team: 2 vCPUs, 3-4 OpenMP threads, and a SmolLM2 decode step at 32 rows took 116 ms instead of 90.

So an engine runs every step, weight load and KV copy on its own thread, and the threads that only serve it
(the constructing thread, the event loop's) give their OpenMP workers back (`release_openmp_workers`). Code on
those threads that calls torch again simply gets a new team; the engine is only fast while nothing else computes,
which is also the only time it can be.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from envhub.trainer.engines.embedded.hardware import release_openmp_workers
from envhub.trainer.engines.embedded.threads import raise_thread_priority

T = TypeVar("T")


class ComputeThread:
    """A single worker thread; `run` awaits a call on it from the event loop.

    `priority`: nice levels above the process's own for this thread (`raise_thread_priority`), set when it starts
    and so inherited by the OpenMP workers its first parallel region creates; `nice_applied` is the thread's nice
    value once it runs (the process's where raising was refused).
    """

    def __init__(self, name: str, priority: int = 0) -> None:
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self.priority = priority
        self.nice_applied: int | None = None  # known once the thread has started

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the compute thread (started on first use, again after `close`)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=self._name, initializer=self._set_priority
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def _set_priority(self) -> None:
        self.nice_applied = raise_thread_priority(self.priority)

    def close(self) -> None:
        """Let the thread end once its current call returns (its OpenMP team ends with it)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)


def releasing_openmp(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn`, after which the calling thread gives its OpenMP workers back: for work that computes in bursts on a
    shared thread (a learner step run by `asyncio.to_thread`), so an engine decoding in between has the cores'
    OpenMP threads to itself."""

    @functools.wraps(fn)
    def burst(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            release_openmp_workers()

    return burst
