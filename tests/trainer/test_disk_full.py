"""A run directory that cannot be written: a real size-limited tmpfs fills up at the second checkpoint, a read-only
one refuses the first write. The run stops with one line, the previous checkpoint intact; freed, it resumes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.trainer.config import load_config
from envhub.trainer.learner.checkpoint import latest_checkpoint, load_checkpoint
from envhub.trainer.models import load_tokenizer, tiny_llama
from envhub.trainer.train import Trainer

pytest.importorskip("envhub.trainer.engines.embedded.engine")
REPO = Path(__file__).resolve().parents[2]
CHECKPOINT_MB = 77  # one checkpoint of the tiny model: fp32 weights, Adam state, tokenizer


@pytest.fixture
def mount_tmpfs(tmp_path):
    """mount(options) -> a fresh tmpfs directory; unmounted at the end (skips where mounting is not allowed)."""
    mounted = []

    def mount(options: str) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); run as root")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _config(path: Path, run_dir: Path, steps: int) -> Path:
    path.write_text(
        "model: {name: tiny}\ntasks: [{env: Letters-v0}]\n"
        "rollout: {group_size: 4, max_new_tokens: 4, max_turns: 1}\n"
        "algorithm: {groups_per_step: 2, lr: 0.01, filter_zero_variance: false}\n"
        f"budget: {{steps: {steps}, checkpoint_every: 1, checkpoint_keep: 3}}\nout_dir: {run_dir}\n"
    )
    return path


def _train(config: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "envhub.cli.main", "train", str(config), *extra]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)


def _error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    return next(line for line in stderr.splitlines() if line.startswith("envhub: error:"))


@pytest.mark.slow
async def test_a_full_disk_keeps_the_previous_checkpoint_stops_cleanly_and_resumes_once_freed(tmp_path, mount_tmpfs):
    disk = mount_tmpfs(f"size={int(CHECKPOINT_MB * 1.6)}m")  # room for one checkpoint, not two
    run_dir = disk / "run"
    config = _config(tmp_path / "run.yaml", run_dir, steps=4)
    full = _train(config)
    assert full.returncode == 2, full.stderr
    line = _error_line(full.stderr)
    assert "cannot write checkpoint step 2" in line and "No space left on device" in line, line
    assert f"the previous checkpoint {run_dir / 'checkpoints' / 'step_000001'} is intact" in line
    saved = latest_checkpoint(run_dir)
    assert saved.step == 1 and [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000001"]
    load_checkpoint(saved, tiny_llama(load_tokenizer("tiny"), seed=1), None)  # every tensor there, strictly

    subprocess.run(["mount", "-o", f"remount,size={CHECKPOINT_MB * 5}m", str(disk)], check=True)
    # the resume is in this process: a second `envhub train` would only add its imports (~5 CPU s)
    resumed = await Trainer(load_config(config)).run(resume=True)
    assert (resumed.first_step, resumed.last_step) == (1, 4)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # step 2's row, logged before its checkpoint failed, is there once
    assert latest_checkpoint(run_dir).step == 4


@pytest.mark.slow
def test_a_read_only_run_directory_is_one_line_before_any_work(tmp_path, mount_tmpfs):
    disk = mount_tmpfs("size=1m,ro")
    refused = _train(_config(tmp_path / "run.yaml", disk / "run", steps=2))
    assert refused.returncode == 2
    line = _error_line(refused.stderr)
    assert f"cannot write {disk / 'run'}: Read-only file system" in line, line
    assert "no checkpoint was written" in line
