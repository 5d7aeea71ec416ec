"""One run per directory: a new run refuses a directory that already holds one, unless told to resume or overwrite.

Without this a second `envhub train` into the same `out_dir` appended its metrics to the first run's (steps
restarting at 1), left the first run's later checkpoints beside its own and rewound `latest`. The refusal names both
ways on: `--resume` continues the run that is there, `--overwrite` deletes what the trainer wrote there and starts
again. A fresh suffixed directory (runs/demo-2) was the other choice; refusing was taken because scripts, `envhub
view` and the README read a run where its config says it is, and a directory that moves silently is the same
surprise as one that mixes silently.

A directory holds a run once any of `RUN_MARKERS` is there. Files the trainer writes before it has trained or
evaluated anything (config.json alone, after a run that stopped at its preflight) do not count: fixing the config
and running again just works. `--overwrite` removes only what the trainer writes (`RUN_FILES`, `RUN_DIRS` and the
`eval-*` stage folders), never other files a user keeps there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from envhub.errors import ConfigError

#: any of these means a run trained, evaluated or warm-started here
RUN_MARKERS = ("metrics.jsonl", "episodes.jsonl", "checkpoints", "eval.json", "sft.jsonl", "latest")
RUN_FILES = (
    "metrics.jsonl",
    "episodes.jsonl",
    "episode_errors.jsonl",
    "eval.json",
    "stages.json",
    "sft.jsonl",
    "config.json",
    "latest",
    ".latest.tmp",
    "reward_curve.png",
    "summary.json",
)
RUN_DIRS = ("checkpoints", "weights", "engine-weights", "tb")


class RunDirTaken(ConfigError):
    """The output directory already holds a run and neither resume nor overwrite was asked for."""


def holds_run(out_dir: Path) -> list[str]:
    """The marker files of an earlier run in `out_dir` (empty when there is none)."""
    found = [name for name in RUN_MARKERS if (out_dir / name).exists()]
    found += sorted(p.name for p in out_dir.glob("episodes.[0-9]*.jsonl"))
    return found


def claim_run_dir(out_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Make `out_dir` this run's: refuse one holding another run (RunDirTaken), or clear it with `overwrite`."""
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other", hint="choose one")
    found = holds_run(out_dir) if out_dir.is_dir() else []
    if not found or resume:
        return
    if not overwrite:
        raise RunDirTaken(
            f"{out_dir} already holds a run ({', '.join(found[:3])}); a new run there would mix with it",
            hint="--resume continues it, --overwrite deletes it and starts again, or --out another directory",
        )
    for name in RUN_FILES:
        (out_dir / name).unlink(missing_ok=True)
    for path in out_dir.glob("episodes.[0-9]*.jsonl"):
        path.unlink()
    for folder in (*RUN_DIRS, *(p.name for p in out_dir.glob("eval-*") if p.is_dir())):
        shutil.rmtree(out_dir / folder, ignore_errors=True)
