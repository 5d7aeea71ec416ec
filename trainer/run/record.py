"""The run record: every episode, turn by turn, appended to RUN_DIR/episodes.jsonl the moment it ends.

Two kinds of JSON lines share the file:
- `{"kind": "episode", ...}`: task, seed, group, policy versions, reward, finish reason, timings and each turn
  (model text, parsed tool calls, observation capped with a marker, reward, generation and env seconds, and when
  each began: `at` and `env_at`, seconds since the episode started, from which `envhub plan` rebuilds the run);
- `{"kind": "group", "group_id", "task", "outcome", "step"}`: what became of a group once it is known
  (trained, filtered, dropped_stale, failed, unfinished at the end of the run).

Each line is flushed as it is written, so a crash or Ctrl-C loses nothing already played. When the file passes
`max_bytes` it is renamed to `episodes.NNNNNN.jsonl` and a fresh `episodes.jsonl` begins; `read_episodes` reads
every shard in order and joins each episode with its group's outcome. `state()` is what a checkpoint keeps of the
recorder (its counters, the groups still undecided, where the file stood); `envhub.trainer.run.resume` puts the
record back there when a run resumes.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envhub.errors import EnvhubError
from envhub.eval import judged_success
from envhub.toolcalls import parse_tool_calls
from envhub.trainer.trajectory import Trajectory

SUCCESS_REWARD = 1.0  # without the env's verdict (info "success" or "progress"), a return this high is a success
OUTCOMES = ("trained", "filtered", "dropped_stale", "failed", "unfinished")


class RecordError(EnvhubError):
    """A file of the run record that cannot be written (disk full, read-only or unwritable run directory)."""


def write_failure(path: Path, exc: OSError) -> RecordError:
    """The one-line error for a record file that could not be written."""
    return RecordError(
        f"cannot write {path}: {exc.strerror or exc}",
        hint=f"free space or fix the permissions of {path.parent}, then resume with --resume",
    )


def cap_text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, with a marker saying how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[envhub: {len(text) - limit} more characters not recorded]"


@dataclass
class TaskCounters:
    """Per-task totals for metrics.jsonl and TensorBoard."""

    episodes: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    timed_out: int = 0
    groups_trained: int = 0
    groups_filtered: int = 0
    groups_dropped: int = 0
    groups_failed: int = 0

    def as_metrics(self) -> dict[str, float]:
        """Counters plus success rate and mean reward."""
        row: dict[str, float] = asdict(self)
        row.pop("reward_sum")
        row["success_rate"] = self.successes / self.episodes if self.episodes else 0.0
        row["mean_reward"] = self.reward_sum / self.episodes if self.episodes else 0.0
        return row


class EpisodeRecorder:
    """Writes the run's episodes.jsonl (sharded past `max_bytes`) and keeps per-task counters."""

    def __init__(
        self, out_dir: str | Path, *, max_bytes: int = 64 << 20, observation_cap: int = 4000, text_cap: int = 8000
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "episodes.jsonl"
        self.max_bytes = max_bytes
        self.observation_cap = observation_cap
        self.text_cap = text_cap
        self.tasks: dict[str, TaskCounters] = defaultdict(TaskCounters)
        self.episodes_done = 0
        self.model_tokens = 0
        self.started = time.monotonic()
        self._pending: dict[str, str] = {}  # group id -> task, for groups whose outcome is not known yet
        self.shards = len(list(self.out_dir.glob("episodes.[0-9]*.jsonl")))
        self.write_error: RecordError | None = None  # set by the first write that fails; the trainer stops on it
        self._file = self.path.open("a", encoding="utf-8")

    def episode(self, trajectory: Trajectory, step: int) -> None:
        """Append one finished episode."""
        t = trajectory
        model_versions = sorted({v for v, m in zip(t.versions, t.loss_mask) if m})
        turns = [self._turn(entry) for entry in t.turn_log]
        record = {
            "kind": "episode",
            "task": t.task,
            "seed": t.seed,
            "group_id": t.group_id,
            "step": step,
            "policy_versions": model_versions,
            "reward": t.reward,
            "finish_reason": t.finish_reason,
            "turns": t.turns,
            "model_tokens": t.num_model_tokens,
            "total_tokens": len(t.input_ids),
            "duration_s": round(t.duration_s, 4),
            "generate_s": round(sum(e.get("generate_s", 0.0) for e in t.turn_log), 4),
            "env_s": round(sum(e.get("env_s", 0.0) for e in t.turn_log), 4),
            "env_info": t.env_info,
            # the servers that generated its turns, when a run has several (one, unless a server died mid-episode)
            **({"engines": engines} if (engines := _engines(t.turn_log)) else {}),
            "log": turns,
            "time": time.time(),
        }
        self._write(record)
        if t.group_id and t.finish_reason != "cancelled":
            self._pending.setdefault(t.group_id, t.task)
        if t.finish_reason == "cancelled":
            return  # over-provisioned spares cut by their group: recorded, but not counted as finished
        counters = self.tasks[t.task]
        counters.episodes += 1
        info = t.env_info
        progress = info.get("progress") if isinstance(info.get("progress"), (int, float)) else None
        success = info.get("success") if isinstance(info.get("success"), bool) else None
        counters.successes += judged_success(success, progress, t.reward, SUCCESS_REWARD)
        counters.reward_sum += t.reward
        counters.timed_out += t.finish_reason == "timeout"
        self.episodes_done += 1
        self.model_tokens += t.num_model_tokens

    def group(self, group_id: str, task: str, outcome: str, step: int) -> None:
        """Record what became of a group (its episodes were recorded as they ended)."""
        self._pending.pop(group_id, None)
        self._write(
            {"kind": "group", "group_id": group_id, "task": task, "outcome": outcome, "step": step, "time": time.time()}
        )
        counters = self.tasks[task]
        field = {
            "trained": "groups_trained",
            "filtered": "groups_filtered",
            "dropped_stale": "groups_dropped",
            "failed": "groups_failed",
        }.get(outcome)
        if field:
            setattr(counters, field, getattr(counters, field) + 1)

    def task_metrics(self) -> dict[str, Any]:
        """Per-task counters, plus sandbox pool usage when a sandboxed env is in use."""
        row: dict[str, Any] = {task: c.as_metrics() for task, c in sorted(self.tasks.items())}
        pools = sandbox_pool_metrics()
        if pools:
            row["sandbox_pools"] = pools
        return row

    def tokens_per_s(self) -> float:
        """Model tokens of finished episodes per second of run time."""
        return self.model_tokens / max(time.monotonic() - self.started, 1e-9)

    def close(self, step: int) -> None:
        """Mark groups still in flight as unfinished and close the file."""
        self.mark_unfinished(dict(self._pending), step)
        try:
            self._file.close()
        except OSError:  # a full disk: the failed write was reported when it happened
            pass

    def raise_if_failed(self) -> None:
        """Raise the first write failure (RecordError), if any."""
        if self.write_error is not None:
            raise self.write_error

    def mark_unfinished(self, groups: dict[str, str], step: int) -> None:
        """Record `groups` (group id -> task) as unfinished: their episodes were played, the group never trained."""
        for group_id, task in groups.items():
            self.group(group_id, task, "unfinished", step)

    def state(self) -> dict[str, Any]:
        """The per-task counters, the undecided groups and the file's position (shards, bytes), for a checkpoint."""
        return {
            "tasks": {task: asdict(c) for task, c in self.tasks.items()},
            "episodes_done": self.episodes_done,
            "pending": dict(self._pending),
            "shards": self.shards,
            "bytes": self._file.tell() if not self._file.closed else self.path.stat().st_size,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue the counters of `state()` (the file itself is rewound by `envhub.trainer.run.resume`)."""
        self.tasks.update({task: TaskCounters(**c) for task, c in state.get("tasks", {}).items()})
        self.episodes_done = int(state.get("episodes_done", 0))

    def _turn(self, entry: dict[str, Any]) -> dict[str, Any]:
        turn = dict(entry)
        if "observation" in turn:
            turn["observation"] = cap_text(str(turn["observation"]), self.observation_cap)
        if "text" in turn:
            text = str(turn["text"])
            parsed = parse_tool_calls(text)
            turn["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in parsed.calls]
            if parsed.errors:
                turn["tool_call_errors"] = list(parsed.errors)
            turn["text"] = cap_text(text, self.text_cap)
        for key in ("at", "generate_s", "env_at", "env_s"):
            if key in turn:
                turn[key] = round(turn[key], 4)
        return turn

    def _write(self, record: dict[str, Any]) -> None:
        if self._file.closed or self.write_error is not None:
            return
        try:
            self._file.write(json.dumps(record, default=str) + "\n")
            self._file.flush()
            if self._file.tell() >= self.max_bytes:
                self._rotate()
        except OSError as exc:  # never raised into the episode that ended: kept for the trainer to stop on
            self.write_error = write_failure(self.path, exc)

    def _rotate(self) -> None:
        self._file.close()
        index = 1 + max((int(p.name.split(".")[1]) for p in self.out_dir.glob("episodes.[0-9]*.jsonl")), default=0)
        self.path.rename(self.out_dir / f"episodes.{index:06d}.jsonl")
        self.shards += 1
        self._file = self.path.open("a", encoding="utf-8")


def sandbox_pool_metrics() -> dict[str, dict[str, float]]:
    """Usage of the process-wide sandbox pools that sandboxed envs share (`envhub.toolenv.shared_pool`, SWE's
    per-image pools), keyed by backend:image."""
    pools: dict[str, Any] = {}
    toolenv = sys.modules.get("envhub.toolenv")
    for by_spec in list(getattr(toolenv, "_pools", {}).values()):  # one table per event loop
        for key, pool in list(by_spec.items()):
            pools[f"{key[0]}:{key[1] or 'default'}"] = pool
    workspace = sys.modules.get("envhub.envs.swe.workspace")
    for key, pool in list(getattr(workspace, "_pools", {}).items()):
        pools[f"swe-{key[0]}:{key[1] or 'default'}"] = pool
    out = {}
    for name, pool in pools.items():
        try:
            out[name] = asdict(pool.metrics())
        except Exception:  # a pool closed with its event loop has nothing to report
            continue
    return out


def episode_files(run_dir: str | Path) -> list[Path]:
    """The run's episode shards, oldest first."""
    run_dir = Path(run_dir)
    shards = sorted(run_dir.glob("episodes.[0-9]*.jsonl"))
    current = run_dir / "episodes.jsonl"
    return shards + ([current] if current.exists() else [])


def read_episodes(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every recorded episode of a run, each with `group_outcome` (None while its group was undecided).

    Reads a training run's record and `envhub eval --out DIR` records alike (the latter as episodes of outcome
    "evaluated"), so `envhub view` shows both.
    """
    episodes: list[dict[str, Any]] = []
    outcomes: dict[str, str] = {}
    for path in episode_files(run_dir):
        with path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a crash mid-write: skip it, keep the rest
                    continue
                if record.get("kind") == "group":
                    outcomes[record["group_id"]] = record["outcome"]
                elif record.get("kind") == "episode":
                    episodes.append(record)
                elif "env_id" in record and "kind" not in record:
                    episodes.append(from_eval_record(record))
                    outcomes[episodes[-1]["group_id"]] = "evaluated"
    for record in episodes:
        cancelled = record["finish_reason"] == "cancelled"
        record["group_outcome"] = "cancelled" if cancelled else outcomes.get(record["group_id"])
    return episodes


def from_eval_record(record: dict[str, Any]) -> dict[str, Any]:
    """An `envhub eval` episode record (envhub.eval.EpisodeRecord) in the run record's episode shape."""
    seat = record.get("seat")
    task = record["env_id"] if seat is None else f"{record['env_id']}#seat{seat}"
    log: list[dict[str, Any]] = [{"kind": "reset", "observation": record.get("first_observation", "")}]
    for turn in record.get("turns", []):
        log.append(
            {
                "kind": "turn",
                "text": turn.get("action", ""),
                "tool_calls": turn.get("tool_calls", []),
                "observation": turn.get("observation", ""),
                "reward": turn.get("reward", 0.0),
            }
        )
    error = {"error": record["error"], "error_kind": record.get("error_kind")} if record.get("error") else {}
    return {
        "kind": "episode",
        "task": task,
        "seed": record["seed"],
        "group_id": f"eval-{task}-{record['seed']}",
        "step": record.get("attempt", 0),
        "policy_versions": [],
        "reward": record.get("reward", 0.0),
        "finish_reason": record.get("finish", "error"),
        "turns": record.get("steps", 0),
        "model_tokens": 0,
        "total_tokens": 0,
        "duration_s": record.get("duration_s", 0.0),
        "generate_s": 0.0,
        "env_s": 0.0,
        "env_info": error,
        "log": log,
    }


def _engines(turn_log: list[dict[str, Any]]) -> list[str]:
    """The engines that served an episode's turns, in the order they first did."""
    return list(dict.fromkeys(e["engine"] for e in turn_log if e.get("engine")))
