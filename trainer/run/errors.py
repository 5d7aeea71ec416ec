"""Episode errors per task, counted in one place: every failed episode is counted and written down, and a task
failing again and again stops the run with its error instead of letting training wait forever.

Rollout sources report every finished episode (in this process or from Ray actors alike); `TaskErrors.observe`
counts those that ended in an env error (raised while building, resetting or stepping the env) and clears a task's
run of failures when one of its episodes ends without one. Engine errors (at generate) are counted apart and
are not the task's fault; but an engine that has failed every episode for `engine_down_s` seconds (a server
that died or was never reachable) stops the run with its last error instead of letting it spin forever.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envhub.errors import EngineError, EnvhubError
from envhub.trainer.run.record import RecordError, write_failure
from envhub.trainer.trajectory import Trajectory

# where an exception is the task's (at "generate" it is the engine's): its env, or its harness program
ENV_STAGES = ("build", "reset", "step", "harness")


class TaskFailing(EnvhubError):
    """A task whose episodes keep failing: training stops with the error."""


@dataclass(frozen=True)
class EpisodeError:
    """One failed episode."""

    task: str
    seed: int | None
    stage: str  # "build", "reset", "step" or "harness"
    error: str
    time: float


class TaskErrors:
    """Counts failed episodes per task, logs each to a JSONL file, raises once a task fails `max_in_a_row` in a row."""

    def __init__(
        self,
        max_in_a_row: int,
        log_path: str | Path | None = None,
        engine_down_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_in_a_row = max_in_a_row
        self.engine_down_s = engine_down_s
        self.clock = clock
        self.engine_in_a_row = 0
        self.engine_failing_since: float | None = None  # first engine error since an episode last ran
        self.last_engine_error = ""
        self.log_path = Path(log_path) if log_path is not None else None
        self.total: dict[str, int] = {}
        self.in_a_row: dict[str, int] = {}
        self.last: dict[str, EpisodeError] = {}
        self.engine_errors = 0
        self.write_error: RecordError | None = None  # the log could not be written (raised by raise_if_failing)

    def observe(self, trajectory: Trajectory) -> None:
        """Count one finished episode: an env error, an engine error, or an episode that ran (cancelled ones aside)."""
        stage = trajectory.env_info.get("error_stage")
        if trajectory.finish_reason == "error" and stage in ENV_STAGES:
            self.failed(trajectory.task, trajectory.seed, stage, trajectory.env_info.get("error", "unknown error"))
        elif trajectory.finish_reason == "error":
            self.engine_errors += 1
            self.engine_in_a_row += 1
            if self.engine_failing_since is None:
                self.engine_failing_since = self.clock()
            self.last_engine_error = str(trajectory.env_info.get("error", "unknown error"))[:2000]
        elif trajectory.finish_reason != "cancelled":
            self.succeeded(trajectory.task)
            self.engine_in_a_row, self.engine_failing_since = 0, None  # an episode ran: the engine works

    def failed(self, task: str, seed: int | None, stage: str, error_text: str) -> None:
        """Record a failed episode."""
        error = EpisodeError(task, seed, stage, error_text[:2000], time.time())
        self.total[task] = self.total.get(task, 0) + 1
        self.in_a_row[task] = self.in_a_row.get(task, 0) + 1
        self.last[task] = error
        if self.log_path is not None and self.write_error is None:
            try:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                with self.log_path.open("a") as handle:
                    handle.write(json.dumps(asdict(error)) + "\n")
            except OSError as exc:
                self.write_error = write_failure(self.log_path, exc)

    def succeeded(self, task: str) -> None:
        """Record an episode that ended without an exception."""
        self.in_a_row[task] = 0

    def raise_if_failing(self) -> None:
        """Raise a record write error first; TaskFailing for a task whose last `max_in_a_row` episodes all failed,
        EngineError when the engine has failed every episode (at least `max_in_a_row`) for `engine_down_s` seconds;
        never when the threshold is 0."""
        if self.write_error is not None:
            raise self.write_error
        if self.max_in_a_row <= 0:
            return
        down = self.clock() - self.engine_failing_since if self.engine_failing_since is not None else 0.0
        if self.engine_in_a_row >= self.max_in_a_row and down >= self.engine_down_s:
            raise EngineError(
                f"the inference engine failed every episode for {down:.0f} s ({self.engine_in_a_row} in a row); "
                f"last error: {self.last_engine_error}",
                hint="is the engine server running and reachable at engine.url?",
            )
        for task, count in self.in_a_row.items():
            if count >= self.max_in_a_row:
                last = self.last[task]
                raise TaskFailing(
                    f"task {task}: {count} episodes in a row failed (at {last.stage}); last error: {last.error}",
                    hint=f"fix the env or the task's kwargs; every failure is in {self.log_path or 'the metrics'}; "
                    "rollout.max_task_errors sets this threshold (0 never stops)",
                )

    def state(self) -> dict[str, Any]:
        """Counts and last errors, for a checkpoint (a resumed run continues them)."""
        return {
            "total": dict(self.total),
            "in_a_row": dict(self.in_a_row),
            "last": {task: asdict(error) for task, error in self.last.items()},
            "engine_errors": self.engine_errors,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue the counts of `state()`."""
        self.total = {k: int(v) for k, v in state.get("total", {}).items()}
        self.in_a_row = {k: int(v) for k, v in state.get("in_a_row", {}).items()}
        self.last = {k: EpisodeError(**v) for k, v in state.get("last", {}).items()}
        self.engine_errors = int(state.get("engine_errors", 0))

    def metrics(self) -> dict[str, Any]:
        """Failed-episode counts and the last exception text per task, for the step's metrics row."""
        row: dict[str, Any] = {"engine_errors": self.engine_errors} if self.engine_errors else {}
        if self.total:
            row.update(episode_errors=dict(self.total), episode_error={t: e.error for t, e in self.last.items()})
        return row
