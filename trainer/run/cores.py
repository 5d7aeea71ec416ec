"""How a run shares the machine's cores between the learner, the engine and the envs: one rule, per stage.

A torch op on the CPU runs on an OpenMP team of the calling thread's `torch.get_num_threads()` threads. A team
whose threads another *process* deschedules waits at each of its barriers and burns its share spinning (the engine
kept 22% of its decode rate beside one CPU-bound process with 2 threads, 75% with 1: docs/engines.md, "Sharing the
cores"). Inside one process GNU OpenMP sees every team: once they hold more threads than CPUs, idle workers sleep
instead of spinning, and the learner and the engine share the cores well without a split (a learner step beside
generation: 22.6 s with the engine at 90.7 tokens/s, both on 2 threads; split 1 + 1: 21.4 s and 46.5 tokens/s).

The rule, per stage:
- evaluation (the engine alone): the engine takes every core other processes leave free;
- SFT (the learner alone): the learner takes every core other processes leave free, re-measured every step;
- RL: the learner takes every core other processes leave free, re-measured every step (`learner.threads` N: at
  most N threads for a step begun while episodes are generated, and the engine leaves it those N); the engine
  takes every core other processes leave free, re-measured as it runs; learner and engine overlap in one process,
  where OpenMP shares the cores between their teams;
- envs run on the event loop and in sandboxes (other processes) with no torch threads of their own: the cores
  other processes keep busy (sandboxes, dockerd, anything else on the machine) come off the engine's share.

Priority, every stage: the engine's compute thread and the thread of each learner or SFT step (with the OpenMP
workers they start) run `engine.priority` / `learner.priority` nice levels above the process (default 5 each, where
the process may: root or CAP_SYS_NICE); everything else (the event loop, env code, sandboxes, started servers)
stays at the process's level. Equal levels keep engine and learner balanced with each other as before; against other
processes they no longer get only a fair share per thread (one engine thread beside a 2-thread load: ~0.8 of a core
at equal priority, a whole core 5 levels up; docs/engines.md, "Priority").

Free cores are this process's affinity mask. `engine.threads` / `learner.threads` fix either number (0: the rule).
The Trainer prints the rule at start (`describe`).

Why the learner counts other processes too: a tiny model's learner step at 2 threads took 1.81 s beside one
2-thread CPU-bound process against 0.55 s alone, and 0.76 s at 1 thread beside it (15 async steps, 2-core EPYC,
2026-11-29): the same barrier waits as the engine's. The test suite's two workers are each other's load.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from envhub.errors import ConfigError
from envhub.trainer.engines.embedded.hardware import release_openmp_workers
from envhub.trainer.engines.embedded.threads import (
    ThreadRule,
    apply_threads,
    may_raise_priority,
    raise_thread_priority,
    usable_cores,
)

T = TypeVar("T")


class CoreShare:
    """The run's thread rule (module docstring); `engine_threads` is the engine's `threads` callable."""

    def __init__(
        self,
        learner_threads: int = 0,
        engine_threads: int = 0,
        cores: int | None = None,
        learner_priority: int = 0,
        engine_priority: int = 0,
    ) -> None:
        for name, value in (("learner.threads", learner_threads), ("engine.threads", engine_threads)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(
                    f"{name} must be 0 (the rule in docs/engines.md) or a number of threads, got {value!r}",
                    hint=f"remove {name} to let the run share the cores by its rule",
                )
        for name, value in (("learner.priority", learner_priority), ("engine.priority", engine_priority)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 39:
                raise ConfigError(
                    f"{name} must be a number of nice levels from 0 (the process's own priority) to 39, got {value!r}",
                    hint=f"remove {name} for the default (5: docs/engines.md, Sharing the cores)",
                )
        self.learner_priority, self.engine_priority = learner_priority, engine_priority
        self.cores = cores or usable_cores()
        self.learner_beside = min(learner_threads, self.cores) if learner_threads else self.cores
        self.fixed_engine = engine_threads
        self._stepping = 0  # the learner's threads while one of its steps runs, else 0
        self._rule = ThreadRule(self.cores, reserved=lambda: self._stepping)

    @classmethod
    def from_config(cls, config: Any) -> CoreShare:
        return cls(
            config.learner.threads,
            config.engine.threads,
            learner_priority=config.learner.priority,
            engine_priority=config.engine.priority,
        )

    def engine_threads(self) -> int:
        """Threads for the engine's next model step."""
        return self.fixed_engine or self._rule()

    def attach(self, engine: Any) -> None:
        """Let the rule set the threads of `engine`'s model steps (engines with a `threads` setting: embedded)."""
        target = getattr(engine, "inner", engine)
        if getattr(target, "threads", None) is not None:
            target.threads = self.engine_threads

    def alone(self) -> int:
        """Threads for a learner step while nothing generates (SFT, or RL with no episode in flight)."""
        others = self._rule.load  # None where /proc/stat is not there: other processes' load is not known
        busy = round(others.update()) if others is not None else 0
        return max(1, self.cores - busy)

    def beside(self) -> int:
        """Threads for a learner step begun while episodes are generated."""
        return min(self.learner_beside, self.alone())

    def learner_step(self, fn: Callable[..., T], generating: Callable[[], bool]) -> Callable[..., T]:
        """`fn` run as a learner step under the rule; `generating()` says whether episodes are being generated."""

        @functools.wraps(fn)
        def step(*args: Any, **kwargs: Any) -> T:
            beside = generating()
            split = beside and self.learner_beside < self.cores  # learner.threads N: the engine leaves it those N
            threads = self.beside() if beside else self.alone()
            apply_threads(threads)
            self._stepping = threads if split else 0
            try:
                with self.learner_thread():
                    return fn(*args, **kwargs)
            finally:
                self._stepping = 0

        return step

    @contextlib.contextmanager
    def learner_thread(self) -> Iterator[None]:
        """The calling thread at the learner's priority for the block (a learner or SFT step, run on a pool thread);
        afterwards at the process's again, its OpenMP workers (started at the learner's priority) ended, so the
        engine decoding in between has the cores' OpenMP threads to itself."""
        raise_thread_priority(self.learner_priority)
        try:
            yield
        finally:
            raise_thread_priority(0)
            release_openmp_workers()

    def describe(self) -> str:
        engine = (
            f"{self.fixed_engine} threads (engine.threads)"
            if self.fixed_engine
            else f"the cores other processes leave free (of {self.cores})"
            + (f", less the learner's {self.learner_beside} while it steps" if self.learner_beside < self.cores else "")
        )
        return (
            f"cores: {self.cores}; learner {self.learner_beside} threads beside generation, {self.cores} alone, less "
            "the cores other processes keep busy; "
            f"engine {engine}; torch threads now {torch.get_num_threads()}; {self.describe_priority()} "
            "(docs/engines.md, Sharing the cores)"
        )

    def describe_priority(self) -> str:
        levels = f"engine +{self.engine_priority}, learner +{self.learner_priority} nice levels over the process"
        if not (self.engine_priority or self.learner_priority):
            return "priority: the process's own"
        if may_raise_priority():
            return f"priority: {levels}"
        return f"priority: the process's own ({levels} refused: needs root or CAP_SYS_NICE)"
