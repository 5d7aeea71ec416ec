"""Exact resume: where the run record stood when a checkpoint was taken, and the record put back there.

A checkpoint keeps, beside the learner, queue and sampler, the run record's position: the size of metrics.jsonl
and episode_errors.jsonl, the episode shards and the size of episodes.jsonl, the recorder's and the error
counters, the groups whose outcome was still open, and how many groups the run had started (group ids stay
unique). A run killed after that (kill -9, a lost machine) had written rows for steps the checkpoint does not hold;
`--resume` cuts every file back to the checkpoint's position before the run goes on, and TensorBoard is told to
hide what the dead process logged past it (`purge_step`), so each step, episode and TensorBoard point is in the
record once, in order. Groups that were in flight at the checkpoint are recorded as unfinished: their episodes
were played, the group never trained. `--resume` with no checkpoint yet starts over with an empty record.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from envhub.trainer.engines import EngineDown
from envhub.trainer.learner.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint
from envhub.trainer.run.errors import TaskErrors
from envhub.trainer.run.record import EpisodeRecorder, RecordError

METRICS_FILE = "metrics.jsonl"
ERRORS_FILE = "episode_errors.jsonl"
EPISODES_FILE = "episodes.jsonl"
# errors that say the run directory cannot take more writes (disk or quota full, read-only, permissions)
RUN_DIR_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def stop_error(failure: BaseException, out_dir: Path, step: int | None) -> BaseException:
    """A failure that stops a run (an engine gone, a run directory that cannot be written), restated in one line
    naming the checkpoint to resume from; any other failure is returned as it is."""
    if isinstance(failure, OSError) and failure.errno in RUN_DIR_ERRNOS:
        where = failure.filename or out_dir
        failure = RecordError(f"cannot write {where}: {failure.strerror}", hint=f"free space under {out_dir}")
    if not isinstance(failure, (EngineDown, RecordError)):
        return failure
    at = f"the run stopped at step {step}" if step is not None else "the run stopped before its first step"
    return type(failure)(f"{failure.args[0]}; {at}; {resume_advice(out_dir)}", hint=failure.hint)


def resume_advice(out_dir: Path) -> str:
    """Which checkpoint a stopped run resumes from, as the end of its one-line error."""
    try:
        saved = latest_checkpoint(out_dir)
    except (OSError, ValueError, KeyError):
        saved = None
    if saved is None:
        return "no checkpoint was written: the run starts over"
    return f"resume from checkpoint {saved.path} (step {saved.step}) with --resume"


def record_state(out_dir: Path, recorder: EpisodeRecorder, errors: TaskErrors, producer: Any) -> dict:
    """The run record's position and counters now (taken with the queue and sampler state, on the event loop)."""
    return {
        "metrics_bytes": _size(out_dir / METRICS_FILE),
        "errors_bytes": _size(out_dir / ERRORS_FILE),
        "recorder": recorder.state(),
        "errors": errors.state(),
        "groups_started": producer.started,
    }


def rewind_record(out_dir: Path, state: dict[str, Any] | None) -> None:
    """Cut metrics.jsonl, episode_errors.jsonl and the episode shards back to `state` ({} or None: to empty).

    Safe to repeat: a resume killed while rewinding rewinds to the same place the next time.
    """
    state = state or {}
    recorder = state.get("recorder", {})
    _truncate(out_dir / METRICS_FILE, int(state.get("metrics_bytes", 0)))
    _truncate(out_dir / ERRORS_FILE, int(state.get("errors_bytes", 0)))
    _rewind_episodes(out_dir, int(recorder.get("shards", 0)), int(recorder.get("bytes", 0)))


def restore_record(
    state: dict[str, Any], recorder: EpisodeRecorder, errors: TaskErrors, producer: Any, step: int
) -> None:
    """Continue the counters of `state`; groups undecided at the checkpoint are recorded as unfinished."""
    recorder.load_state(state.get("recorder", {}))
    errors.load_state(state.get("errors", {}))
    producer.started = int(state.get("groups_started", 0))
    recorder.mark_unfinished(state.get("recorder", {}).get("pending", {}), step)


def _rewind_episodes(out_dir: Path, shards: int, size: int) -> None:
    """Shards past `shards` were rotated after the checkpoint: the first of them was the file being written then."""
    current = out_dir / EPISODES_FILE
    later = sorted(p for p in out_dir.glob("episodes.[0-9]*.jsonl") if _shard_index(p) > shards)
    if later:
        for path in [*later[1:], current]:
            path.unlink(missing_ok=True)
        later[0].rename(current)
    _truncate(current, size)


def _shard_index(path: Path) -> int:
    return int(path.name.split(".")[1])


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _truncate(path: Path, size: int) -> None:
    if path.exists() and path.stat().st_size > size:
        os.truncate(path, size)


def restore_checkpoint(checkpoint: Checkpoint, learner: Any, queue: Any, sampler: Any) -> int:
    """Load `checkpoint` into learner, queue and sampler; returns its step."""
    if learner.sharded:  # FSDP: rank 0 reads the full checkpoint, every process keeps its shards
        learner.load_sharded_checkpoint(checkpoint.path)
    else:
        load_checkpoint(checkpoint, learner.model, learner.optimizer)
    learner.load_extra_state(checkpoint.state.get("learner", {}))
    learner.broadcast_state()  # other learner processes take rank 0's loaded state
    queue.load_state(checkpoint.state["queue"])
    sampler.load_state(checkpoint.state["sampler"])
    return checkpoint.step


def save_run(
    out_dir: Path,
    step: int,
    learner: Any,
    tokenizer: Any,
    snapshot: Any,
    producer: Any,
    errors: TaskErrors,
    budget: Any,
) -> Path:
    """Write the checkpoint of `step`: the learner's `snapshot`, the queue, the sampler and where the run record
    stands (where --resume rewinds to). Blocking: run it off the event loop."""
    queue, sampler = producer.queue, producer.sampler
    state = {
        "queue": queue.state(),
        "sampler": sampler.state(),
        "version": queue.version,
        "learner": snapshot.extra,
        "record": record_state(out_dir, producer.recorder, errors, producer),
    }
    return save_checkpoint(
        out_dir,
        step,
        learner.model if snapshot.adapter_only else learner.hf_model(),
        tokenizer,
        snapshot.optimizer,
        state,
        model_state=snapshot.model,
        max_shard_size=budget.checkpoint_max_shard_size,
        keep=budget.checkpoint_keep,
    )
