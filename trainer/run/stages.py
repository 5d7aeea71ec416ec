"""Where a run's time goes: each stage before RL (evaluations, SFT, the engine's start), RL, the final evaluation,
and within RL, per step, the learner, the weight push and the learner's wait for a batch.

`StageClock` times the stages and writes RUN_DIR/stages.json after each one (this process's stages: a resumed run
starts its own); `summary()` is the breakdown `envhub train` prints at the end. `StepTimer` gives each metrics row
its `time/*` and `engine/*` figures. One writer of both: the Trainer.

Per step, over the step's interval (from the end of the previous step to the end of this one):
- `time/wait_s`: the learner waiting for its batch; `time/idle_s`: the part of that wait in which the engine ran no
  model step either (envs, sandboxes, Python), known for engines that count their busy seconds (embedded);
- `time/learner_s`, `time/push_s`: the learner's step and the weight push;
- `time/generate_s`, `time/env_s`: episode-seconds the batch's episodes spent waiting on the engine and in their envs
  (reset and steps, sandboxes included); episodes overlap, so these add up to more than the wall time;
- `engine/decode_tokens_per_s`: decode tokens over decode seconds in the interval (the engine's own rate, not
  diluted by idle time), `engine/busy_s`, and of it `engine/prefill_s` (prefill steps: prompts and each turn's
  new tokens).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FILE = "stages.json"


class StageClock:
    """Wall seconds of each stage of a run, in order; RL's step count alongside."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / FILE
        self.stages: dict[str, float] = {}
        self.rl_steps = 0
        self.rl_step_means: dict[str, float] = {}
        self.rl_started: float | None = None

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as stage `name` (written even when the block raises: the time was spent)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.stages[name] = round(time.monotonic() - started, 1)
            self.write()

    def final_evaluation_reserve(self) -> float:
        """Seconds to keep for the evaluation after RL: 1.25 x the latest evaluation of the run (the same episodes;
        the trained policy took up to 1.25x the SFT checkpoint's time in the demo), 0 when none ran yet."""
        latest = [seconds for name, seconds in self.stages.items() if name.startswith("evaluation")]
        return 1.25 * latest[-1] if latest else 0.0

    def start_rl(self) -> None:
        """Mark RL's start (the time budget counts from here)."""
        self.rl_started = time.monotonic()

    def end_rl(self, steps: int, rows: list[dict[str, Any]]) -> None:
        """RL is over after `steps` steps of this process; `rows` are their metrics rows."""
        if self.rl_started is None:
            return
        self.stages["rl"] = round(time.monotonic() - self.rl_started, 1)
        self.rl_steps = steps
        keys = ("time/interval_s", "time/wait_s", "time/idle_s", "time/learner_s", "time/push_s")
        keys += ("time/generate_s", "time/env_s", "engine/decode_tokens_per_s")
        for key in keys:
            values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
            if values:
                self.rl_step_means[key] = round(sum(values) / len(values), 2)
        self.write()

    def report(self) -> dict[str, Any]:
        rl_s = self.stages.get("rl", 0.0)
        return {
            "stages_s": self.stages,
            "total_s": round(sum(self.stages.values()), 1),
            "rl_steps": self.rl_steps,
            "rl_steps_per_minute": round(60 * self.rl_steps / rl_s, 2) if rl_s else None,
            "rl_step_means": self.rl_step_means,
        }

    def write(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        with contextlib.suppress(OSError):  # a figure, never the reason a run stops (a full disk is reported elsewhere)
            tmp.write_text(json.dumps(self.report(), indent=2))
            tmp.replace(self.path)

    def summary(self) -> str:
        """Stages with seconds, then RL's steps per minute and a mean step's breakdown."""
        report = self.report()
        parts = [f"{name} {seconds:.0f}s" for name, seconds in self.stages.items()]
        lines = [f"time: {' | '.join(parts)} | total {report['total_s']:.0f}s"]
        if self.rl_steps and report["rl_steps_per_minute"] is not None:
            means = self.rl_step_means
            step = ", ".join(
                f"{label} {means[key]:.1f}s"
                for label, key in (
                    ("learner", "time/learner_s"),
                    ("push", "time/push_s"),
                    ("wait", "time/wait_s"),
                    ("of it idle", "time/idle_s"),
                )
                if key in means
            )
            rate = means.get("engine/decode_tokens_per_s")
            lines.append(
                f"rl: {self.rl_steps} steps, {report['rl_steps_per_minute']:.2f} per minute; a step "
                f"{means.get('time/interval_s', 0.0):.1f}s: {step}"
                + (f"; engine decode {rate:.0f} tok/s" if rate is not None else "")
            )
        return "\n".join(lines)

    def shortfall(self, configured_steps: int, max_time_s: float, max_run_s: float = 0.0) -> str | None:
        """A line when the time budget fitted fewer than half the configured steps, naming the figures."""
        if not (max_time_s or max_run_s) or self.rl_steps * 2 >= configured_steps:
            return None
        means = self.rl_step_means
        step_s = means.get("time/interval_s")
        cause = ""
        if step_s is not None:
            learner, wait = means.get("time/learner_s", 0.0), means.get("time/wait_s", 0.0)
            cause = (
                f" at {step_s:.1f}s a step (learner {learner:.1f}s, waiting for episodes {wait:.1f}s); "
                f"{configured_steps} steps need about {configured_steps * step_s:.0f}s"
            )
        limits = [f"budget.max_time_s = {max_time_s:.0f}s of RL"] if max_time_s else []
        limits += (
            [f"budget.max_run_s = {max_run_s:.0f}s in all, RL had {self.stages.get('rl', 0.0):.0f}s"]
            if max_run_s
            else []
        )
        return (
            f"RL fitted {self.rl_steps} of its {configured_steps} configured steps ({'; '.join(limits)}){cause}: "
            "raise the time budget or lower budget.steps"
        )


def timeouts_line(last_row: dict[str, Any] | None, timeout_s: float) -> str | None:
    """A line when training episodes passed `rollout.episode_timeout_s` (from a metrics row's cumulative queue
    counters), naming the fix; None when none did.

    A timed-out episode leaves its group, so a run whose episodes time out learns from those that end soonest: on a
    2-core EPYC 23 of 32 twelve-turn Sokoban episodes passed the 120 s default beside the learner."""
    queue = (last_row or {}).get("queue") or {}
    episodes, groups = int(queue.get("timed_out_episodes", 0)), int(queue.get("timed_out_groups", 0))
    if not episodes:
        return None
    return (
        f"{episodes} training episodes passed rollout.episode_timeout_s ({timeout_s:g} s) and left their groups "
        f"({groups} groups dropped whole): the run learned from the episodes that end soonest; raise it for this "
        "machine (it is a watchdog for a hung env, not a budget)"
    )


def engine_counters(engine: Any) -> tuple[float, float, int] | None:
    """(busy seconds, decode seconds, decode tokens) so far, for engines that count them (the embedded one)."""
    stats = getattr(engine, "stats", None)
    if stats is None or not hasattr(stats, "decode_s"):
        return None
    return stats.prefill_s + stats.decode_s, stats.decode_s, stats.decode_rows


class StepTimer:
    """The `time/*` and `engine/*` figures of each RL step (see the module docstring)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.interval_started = time.monotonic()
        self._at_interval = engine_counters(engine)
        self._wait_started = self.interval_started
        self._at_wait: tuple[float, float, int] | None = None
        self.wait_s = 0.0
        self.idle_s: float | None = None

    def waiting(self) -> None:
        """The learner starts waiting for a batch."""
        self._wait_started = time.monotonic()
        self._at_wait = engine_counters(self.engine)

    def got_batch(self) -> None:
        """The batch arrived (the learner steps next)."""
        now = time.monotonic()
        self.wait_s = now - self._wait_started
        counters = engine_counters(self.engine)
        if counters is not None and self._at_wait is not None:
            self.idle_s = max(0.0, self.wait_s - (counters[0] - self._at_wait[0]))

    def row(self, learner_s: float, push_s: float, trajectories: list[Any]) -> dict[str, Any]:
        """The step's figures; the next interval starts now."""
        now = time.monotonic()
        turns = [turn for t in trajectories for turn in (t.turn_log or [])]
        figures: dict[str, Any] = {
            "time/interval_s": now - self.interval_started,
            "time/wait_s": self.wait_s,
            "time/idle_s": self.idle_s,
            "time/learner_s": learner_s,
            "time/push_s": push_s,
            "time/generate_s": sum(turn.get("generate_s", 0.0) for turn in turns),
            "time/env_s": sum(turn.get("env_s", 0.0) for turn in turns),
        }
        counters = engine_counters(self.engine)
        if counters is not None and self._at_interval is not None:
            busy, decode_s, decode_tokens = (now_ - then for now_, then in zip(counters, self._at_interval))
            figures["engine/busy_s"] = busy
            figures["engine/prefill_s"] = busy - decode_s
            figures["engine/decode_tokens_per_s"] = decode_tokens / decode_s if decode_s > 0 else None
        self.interval_started, self._at_interval, self.idle_s = now, counters, None
        return figures
