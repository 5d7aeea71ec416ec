"""Episode errors per task: every failed episode is counted and written down, and a task failing
again and again stops the run with its error instead of letting training wait forever.

`TaskErrors.wrap(task, factory)` returns an env factory whose envs report exceptions raised while
building, resetting or stepping them. An episode that closes without one counts as a success and
clears the task's run of failures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envhub.errors import EnvhubError

EnvFactory = Callable[[], Any]


class TaskFailing(EnvhubError):
    """A task whose episodes keep failing: training stops with the error."""


@dataclass(frozen=True)
class EpisodeError:
    """One failed episode."""

    task: str
    seed: int | None
    stage: str  # "build", "reset" or "step"
    error: str
    time: float


class TaskErrors:
    """Counts failed episodes per task, logs each to a JSONL file, and raises once a task fails `max_in_a_row` times
    running."""

    def __init__(self, max_in_a_row: int, log_path: str | Path | None = None) -> None:
        self.max_in_a_row = max_in_a_row
        self.log_path = Path(log_path) if log_path is not None else None
        self.total: dict[str, int] = {}
        self.in_a_row: dict[str, int] = {}
        self.last: dict[str, EpisodeError] = {}

    def wrap(self, task: str, factory: EnvFactory) -> EnvFactory:
        """An env factory for `task` whose envs report their exceptions here."""

        def make() -> Any:
            try:
                env = factory()
            except Exception as exc:
                self.failed(task, None, "build", exc)
                raise
            return _Watched(env, task, self)

        return make

    def failed(self, task: str, seed: int | None, stage: str, exc: BaseException) -> None:
        """Record a failed episode."""
        error = EpisodeError(task, seed, stage, f"{type(exc).__name__}: {exc}"[:2000], time.time())
        self.total[task] = self.total.get(task, 0) + 1
        self.in_a_row[task] = self.in_a_row.get(task, 0) + 1
        self.last[task] = error
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a") as handle:
                handle.write(json.dumps(asdict(error)) + "\n")

    def succeeded(self, task: str) -> None:
        """Record an episode that ended without an exception."""
        self.in_a_row[task] = 0

    def raise_if_failing(self) -> None:
        """Raise TaskFailing for a task whose last `max_in_a_row` episodes all failed (never when the threshold is
        0)."""
        if self.max_in_a_row <= 0:
            return
        for task, count in self.in_a_row.items():
            if count >= self.max_in_a_row:
                last = self.last[task]
                raise TaskFailing(
                    f"task {task}: {count} episodes in a row failed (at {last.stage}); last error: {last.error}",
                    hint=f"fix the env or the task's kwargs; every failure is in {self.log_path or 'the metrics'}; "
                    "rollout.max_task_errors sets this threshold (0 never stops)",
                )

    def metrics(self) -> dict[str, Any]:
        """Failed-episode counts and the last exception text per task, for the step's metrics row."""
        if not self.total:
            return {}
        return {"episode_errors": dict(self.total), "episode_error": {t: e.error for t, e in self.last.items()}}


class _Watched:
    """An env that reports its exceptions to a TaskErrors; everything else passes through."""

    def __init__(self, env: Any, task: str, errors: TaskErrors) -> None:
        self._env, self._task, self._errors = env, task, errors
        self._seed: int | None = None
        self._failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self._seed = seed
        try:
            return await self._env.areset(seed=seed, options=options)
        except Exception as exc:
            self._fail("reset", exc)
            raise

    async def astep(self, action: Any) -> Any:
        try:
            return await self._env.astep(action)
        except Exception as exc:
            self._fail("step", exc)
            raise

    async def aclose(self) -> None:
        if not self._failed:
            self._errors.succeeded(self._task)
        if hasattr(self._env, "aclose"):
            await self._env.aclose()
        else:
            self._env.close()

    def _fail(self, stage: str, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            self._errors.failed(self._task, self._seed, stage, exc)
