"""What a training run recorded about its stages, read back from RUN_DIR for `envhub plan`.

The run directory holds `config.json`, `metrics.jsonl` (one row per learner step: `learner_s`, `step_s`, `time`)
and `episodes.jsonl` (every episode: when it ended, how long it took, and per turn when generation and the env
step began and how long each took, with token counts; a sandboxed env's reset info names its acquire latency).
From these `read_run` rebuilds each episode as a trace of stages (sandbox acquire, reset, generate, env step,
close) and places every stage on the run's clock, so the model can see what else was running at the same time.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError
from envhub.trainer.run.record import episode_files, read_episodes


@dataclass(frozen=True)
class Span:
    """One stage of one episode on the run's clock (seconds since the run started)."""

    kind: str  # acquire, reset, generate, step, final, close
    start: float
    end: float
    tokens: int = 0  # generated tokens (generate spans)

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0.0)


@dataclass(frozen=True)
class Turn:
    """One model turn of a recorded episode: tokens generated, then the env step that answered them."""

    new_tokens: int
    prompt_tokens: int
    env_s: float
    final: bool  # the episode's last step (its grading, for envs that grade at the end)


@dataclass(frozen=True)
class Episode:
    """A recorded episode as a trace of stage times."""

    group_id: str
    build_s: float  # env construction, before reset
    acquire_s: float  # waiting for a sandbox (0 without one)
    reset_s: float  # reset after the sandbox was handed out
    turns: tuple[Turn, ...]
    close_s: float  # after the last step: closing the env, releasing its sandbox
    total_tokens: int
    model_tokens: int
    finish_reason: str
    spans: tuple[Span, ...] = ()


@dataclass(frozen=True)
class Group:
    """A recorded GRPO group: its episodes and what became of it."""

    group_id: str
    episodes: tuple[Episode, ...]
    outcome: str | None  # trained, filtered, dropped_stale, failed, unfinished (None: not recorded)
    trained_at: int | None = None  # the learner step it went into


@dataclass(frozen=True)
class Step:
    """One learner step of the run."""

    learner_s: float
    publish_s: float  # after the learner until the next version was published (weights pushed)
    tokens: int  # every token of the step's episodes (what the learner runs through)
    start: float  # on the run's clock


@dataclass(frozen=True)
class CpuSample:
    """Where the CPUs went from the run's preparation until one metrics row (cumulative CPU seconds)."""

    time: float  # on the run's clock
    trainer_s: float  # the trainer process: engine (embedded), learner, event loop
    machine_s: float  # every CPU of the machine: the trainer, sandboxes, dockerd, anything else
    cpus: int


@dataclass
class RunRecord:
    """Everything `envhub plan` reads from one run directory."""

    run_dir: Path
    config: dict[str, Any]
    groups: list[Group]
    steps: list[Step]
    startup_s: float  # run start to the first episode's start
    wall_s: float  # run start to the last step's metrics row
    pool: dict[str, float] = field(default_factory=dict)  # sandbox pool metrics of the last row (may be empty)
    cpu: list[CpuSample] = field(default_factory=list)  # one per metrics row that counted CPUs (runs since 11-25)

    @property
    def episodes(self) -> list[Episode]:
        return [e for g in self.groups for e in g.episodes]

    @property
    def mode(self) -> str:
        return self.config.get("algorithm", {}).get("mode", "async")

    def setting(self, section: str, key: str, default: Any) -> Any:
        """A value of the run's config."""
        return self.config.get(section, {}).get(key, default)


def read_run(run_dir: str | Path) -> RunRecord:
    """Read a training run's directory; ConfigError when it is not one or recorded too little to plan from."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a directory", hint="pass a training run's out_dir (envhub train --out)")
    for name in ("config.json", "metrics.jsonl", "episodes.jsonl"):
        if not (run_dir / name).exists():
            raise ConfigError(
                f"{run_dir} has no {name}: not a training run's directory",
                hint="pass the out_dir of `envhub train`, or keep the benchmark's runs: envhub bench async --keep-runs",
            )
    try:
        config = json.loads((run_dir / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{run_dir}/config.json is not JSON: {exc}") from None
    rows = _metric_rows(run_dir / "metrics.jsonl")
    keys = ("time", "elapsed_s", "step_s", "learner/learner_s")
    if not rows or not all(_number(r.get(k, 0.0)) for r in rows for k in keys):
        raise ConfigError(
            f"{run_dir}/metrics.jsonl has no step rows with wall-clock times",
            hint="the run must have finished at least one learner step with this version of envhub",
        )
    run_start = rows[0]["time"] - rows[0]["elapsed_s"]
    # spares cut by their group (redundancy) never finished: they are not traces of whole episodes
    raw = [e for e in read_episodes(run_dir) if e.get("finish_reason") != "cancelled"]
    timed = [e for e in raw if _timed(e)]
    for e in timed:
        _check_times(e, run_dir / "episodes.jsonl")
    episodes = [_episode(e, run_start) for e in timed]
    if not episodes:
        raise ConfigError(
            f"{run_dir}/episodes.jsonl has no episodes with stage timings",
            hint="record a run with this version of envhub (turns carry `at` and `env_at`)",
        )
    groups = _groups(episodes, {e["group_id"]: e.get("group_outcome") for e in raw}, _trained_at(run_dir))
    first = min(s.start for e in episodes for s in e.spans)
    return RunRecord(
        run_dir=run_dir,
        config=config,
        groups=groups,
        steps=_steps(rows, run_start, groups),
        startup_s=max(first, 0.0),
        wall_s=rows[-1]["elapsed_s"],
        pool=_pool_metrics(rows[-1]),
        cpu=_cpu_samples(rows, run_start),
    )


def _cpu_samples(rows: list[dict[str, Any]], run_start: float) -> list[CpuSample]:
    """The rows' CPU accounting, when every row has it (a run recorded before it has none)."""
    keys = ("trainer_cpu_s", "machine_cpu_s", "cpus")
    if not all(_number(r.get(k)) for r in rows for k in keys):
        return []
    return [
        CpuSample(r["time"] - run_start, float(r["trainer_cpu_s"]), float(r["machine_cpu_s"]), int(r["cpus"]))
        for r in rows
    ]


def _metric_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a row cut by a crash mid-write
            continue
    return [r for r in rows if "step_s" in r]


def _number(value: Any) -> bool:
    """A finite number >= 0 (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _timed(record: dict[str, Any]) -> bool:
    """Whether an episode record carries the stage start times the planner needs."""
    turns = [t for t in record.get("log", []) if t.get("kind") == "turn"]
    return bool(turns) and all("at" in t and "env_at" in t for t in turns) and "time" in record


def _check_times(record: dict[str, Any], path: Path) -> None:
    """ConfigError unless every time and token count the planner reads is a finite number >= 0 (a hand-edited or
    corrupted record would otherwise stall the simulation or give negative stage times)."""
    fields = [("time", record.get("time")), ("duration_s", record.get("duration_s"))]
    for t in record.get("log", []):
        if t.get("kind") in ("reset", "turn"):
            keys = ("at", "env_s") if t["kind"] == "reset" else ("at", "env_at", "generate_s", "env_s")
            fields += [(f"{t['kind']}.{k}", t.get(k, 0.0)) for k in keys]
            fields += [(f"{t['kind']}.{k}", t[k]) for k in ("new_tokens", "prompt_tokens") if k in t]
    fields += [(k, record[k]) for k in ("total_tokens", "model_tokens") if k in record]
    for name, value in fields:
        if not _number(value):
            raise ConfigError(
                f"{path}: an episode of group {record.get('group_id')!r} has {name} = {value!r}, not a finite number "
                ">= 0",
                hint="the record is corrupted or was edited; plan from an unmodified run directory",
            )


def _episode(record: dict[str, Any], run_start: float) -> Episode:
    """A recorded episode as stage times, its spans placed on the run's clock."""
    start = record["time"] - record["duration_s"] - run_start
    log = record["log"]
    reset = next((t for t in log if t.get("kind") == "reset"), {"at": 0.0, "env_s": 0.0})
    info = record.get("env_info", {})
    acquire_s = min(float(info.get("sandbox_acquire_s", 0.0)), reset["env_s"])
    turns = [t for t in log if t.get("kind") == "turn"]
    sandboxed = "sandbox_acquire_s" in info
    spans = [Span("acquire", start + reset["at"], start + reset["at"] + acquire_s)] if sandboxed else []
    spans.append(Span("reset", start + reset["at"] + acquire_s, start + reset["at"] + reset["env_s"]))
    trace = []
    for i, t in enumerate(turns):
        final = i == len(turns) - 1
        trace.append(Turn(int(t.get("new_tokens", 0)), int(t.get("prompt_tokens", 0)), float(t["env_s"]), final))
        spans.append(Span("generate", start + t["at"], start + t["at"] + t["generate_s"], int(t.get("new_tokens", 0))))
        spans.append(Span("final" if final else "step", start + t["env_at"], start + t["env_at"] + t["env_s"]))
    last_end = turns[-1]["env_at"] + turns[-1]["env_s"]
    return Episode(
        group_id=record["group_id"],
        build_s=float(reset["at"]),
        acquire_s=acquire_s,
        reset_s=float(reset["env_s"]) - acquire_s,
        turns=tuple(trace),
        close_s=max(record["duration_s"] - last_end, 0.0),
        total_tokens=int(record.get("total_tokens", 0)),
        model_tokens=int(record.get("model_tokens", 0)),
        finish_reason=record.get("finish_reason", ""),
        spans=tuple(spans),
    )


def _groups(episodes: list[Episode], outcomes: dict[str, str | None], trained_at: dict[str, int]) -> list[Group]:
    by_group: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_group[e.group_id].append(e)
    return [Group(gid, tuple(eps), outcomes.get(gid), trained_at.get(gid)) for gid, eps in by_group.items()]


def _steps(rows: list[dict[str, Any]], run_start: float, groups: list[Group]) -> list[Step]:
    """Learner steps: their times on the run's clock and the tokens of the episodes they trained on."""
    tokens: dict[int, int] = defaultdict(int)
    for g in groups:
        if g.trained_at is not None:
            tokens[g.trained_at] += sum(e.total_tokens for e in g.episodes)
    steps = []
    for row in rows:
        learner_s = float(row.get("learner/learner_s", row["step_s"]))
        started = row["time"] - run_start - row["step_s"]
        batch = tokens.get(int(row["step"]), 0) or int(row.get("model_tokens", 0))
        steps.append(Step(learner_s, max(row["step_s"] - learner_s, 0.0), batch, started))
    return steps


def _trained_at(run_dir: Path) -> dict[str, int]:
    """The learner step each trained group went into (from the record's group lines)."""
    steps = {}
    for path in episode_files(run_dir):
        for line in path.read_text(encoding="utf-8").splitlines():
            if '"group"' not in line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("kind") == "group" and record.get("outcome") == "trained":
                steps[record["group_id"]] = int(record["step"])
    return steps


def _pool_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The first sandbox pool's metrics in a metrics row (flattened keys tasks/sandbox_pools/NAME/FIELD)."""
    prefix = "tasks/sandbox_pools/"
    names = sorted({k[len(prefix) :].rsplit("/", 1)[0] for k in row if k.startswith(prefix)})
    if not names:
        return {}
    return {k.rsplit("/", 1)[1]: v for k, v in row.items() if k.startswith(f"{prefix}{names[0]}/")}
