"""How many threads the embedded engine's torch work runs on: the cores it may use, less the cores other work keeps
busy, re-read before every model step.

Why it matters on a CPU: each torch op runs on an OpenMP team of `torch.get_num_threads()` threads that meet at a
barrier at its end, some 400 times per SmolLM2 decode step. A team as large as the machine is the fastest while
nothing else runs. Once another CPU-bound process (or the learner, in the same process) takes a share of the cores,
the team's threads are descheduled in turn and every barrier waits, spinning, for the one that is not running: on 2
cores the engine kept 22% of its quiet decode rate beside one CPU-bound process (28 tokens per CPU second against
67 quiet: the CPU it got went into waiting), while vLLM (one OpenMP thread bound per core it keeps, a core left to
its scheduler: one thread on 2 cores) kept all of its rate. A team no larger than the cores left free has no such
wait: on 1 thread the engine kept 75%. Figures and the rule the trainer applies: docs/engines.md, "Sharing the
cores".

`ThreadRule()` is the engine's default (`threads="auto"`): the CPUs of this process's affinity mask, less
`reserved()` (the trainer reserves the learner's threads while a learner step runs), less the cores other processes
kept busy over the last second or so, at least 1.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable

import torch

from envhub.errors import EngineError
from envhub.trainer.run.cpu_usage import cpu_times


class OtherLoad:
    """Cores kept busy by other processes (the machine's busy CPU time less this process's), smoothed."""

    def __init__(self, interval_s: float = 0.5, smoothing: float = 0.5) -> None:
        self.interval_s = interval_s
        self.smoothing = smoothing  # weight of the newest interval
        self._last = cpu_times()
        self.cores = 0.0
        self._lock = threading.Lock()  # read by the engine's compute thread and the learner's alike

    def update(self) -> float:
        """The current estimate; re-measured when `interval_s` has passed since the last measurement (the kernel's
        counters are read only then: this runs before every model step)."""
        if time.monotonic() - self._last[0] < self.interval_s:
            return self.cores
        with self._lock:
            return self._measure()

    def _measure(self) -> float:
        if time.monotonic() - self._last[0] < self.interval_s:  # the other thread measured while this one waited
            return self.cores
        now = cpu_times()
        wall = now[0] - self._last[0]
        if wall > 0:
            others = max(0.0, (now[2] - self._last[2]) - (now[1] - self._last[1])) / wall
            self.cores += self.smoothing * (others - self.cores)
            self._last = now
        return self.cores


class ThreadRule:
    """Threads for the engine's next model step (see the module docstring)."""

    def __init__(
        self,
        cores: int | None = None,
        reserved: Callable[[], int] | None = None,
        watch_load: bool = True,
    ) -> None:
        self.cores = cores or usable_cores()
        self.reserved = reserved or (lambda: 0)
        self.load = OtherLoad() if watch_load and os.path.exists("/proc/stat") else None  # Linux: /proc/stat

    def __call__(self) -> int:
        busy = round(self.load.update()) if self.load is not None else 0
        return max(1, self.cores - self.reserved() - busy)

    def describe(self) -> str:
        return f"{self.cores} cores, less the learner's while it steps" + (
            " and the cores other processes keep busy" if self.load is not None else ""
        )


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return len(getaffinity(0)) if getaffinity is not None else os.cpu_count() or 1


def apply_threads(wanted: int) -> bool:
    """Set this thread's torch thread count to `wanted`; True when it changed."""
    if wanted < 1 or wanted == torch.get_num_threads():
        return False
    torch.set_num_threads(wanted)
    return True


def threads_setting(value: int | str | Callable[[], int] | None) -> Callable[[], int] | None:
    """The engine's `threads` argument as a callable: "auto" (or None) -> ThreadRule(), N -> always N, 0 -> leave
    torch's count alone."""
    if value is None or value == "auto":
        return ThreadRule()
    if callable(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return None if value == 0 else (lambda: value)
    raise EngineError(
        f"engine threads must be auto, 0 or a positive number, got {value!r}",
        hint="auto shares the cores by the rule in docs/engines.md; 0 keeps torch's own count",
    )


def process_nice() -> int:
    """The process's nice value (its main thread's); 0 where the OS has none."""
    getpriority = getattr(os, "getpriority", None)
    return getpriority(os.PRIO_PROCESS, os.getpid()) if getpriority is not None else 0


def raise_thread_priority(levels: int) -> int:
    """Give the calling thread the nice value `levels` below the process's (a higher priority), where allowed;
    returns the thread's nice value afterwards.

    Linux keeps a nice value per thread (`setpriority(PRIO_PROCESS, tid)`), and a thread inherits its creator's, so
    OpenMP workers a thread starts afterwards share it. A nice value below the thread's current one needs root or
    CAP_SYS_NICE: without it the thread keeps its value. `levels` 0 (or a negative number, a lower priority)
    returns the thread to (or below) the process's value, which is always allowed from a higher priority. Where
    the OS has no per-thread priority, nothing changes. Why and the figures: docs/engines.md, "Sharing the cores".
    """
    getpriority = getattr(os, "getpriority", None)
    if getpriority is None or not sys.platform.startswith("linux"):
        return 0
    tid = threading.get_native_id()
    current = getpriority(os.PRIO_PROCESS, tid)
    wanted = max(-20, min(19, process_nice() - levels))
    if wanted != current:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, wanted)
        except PermissionError:
            return current
    return getpriority(os.PRIO_PROCESS, tid)


@functools.cache
def may_raise_priority() -> bool:
    """Whether this process may give a thread a higher priority than its own (root or CAP_SYS_NICE), tried once on a
    throwaway thread."""
    if not sys.platform.startswith("linux"):
        return False
    seen: list[int] = []
    probe = threading.Thread(target=lambda: seen.append(raise_thread_priority(1)), name="envhub-priority-probe")
    probe.start()
    probe.join()
    return bool(seen) and seen[0] < process_nice()
