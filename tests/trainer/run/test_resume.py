"""Exact resume: runs killed with SIGKILL at random points and resumed hold each step once in their record
(metrics.jsonl, episodes.jsonl, TensorBoard), in order."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from envhub.trainer.config import load_config
from envhub.trainer.learner.checkpoint import latest_checkpoint
from envhub.trainer.rollout.producer import GroupProducer
from envhub.trainer.run.errors import TaskErrors
from envhub.trainer.run.record import EpisodeRecorder, read_episodes
from envhub.trainer.run.resume import record_state, restore_record, rewind_record
from envhub.trainer.train import Trainer
from tests.trainer.run.test_records import _trajectory

pytest.importorskip("envhub.trainer.engines.embedded.engine")
REPO = Path(__file__).resolve().parents[3]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_rewind_cuts_every_file_back_to_the_checkpoint_even_across_rotated_shards(tmp_path):
    recorder = EpisodeRecorder(tmp_path, max_bytes=2500)
    errors = TaskErrors(3, tmp_path / "episode_errors.jsonl")
    producer = GroupProducer(
        SimpleNamespace(), SimpleNamespace(), None, recorder, errors, concurrency=1, reward_window=4
    )
    for i in range(5):
        recorder.episode(_trajectory(f"0-{i}"), step=0)
        recorder.group(f"0-{i}", "Math-v0", "trained", 1)
    recorder.episode(_trajectory("1-9"), step=1)  # in flight at the checkpoint
    errors.failed("Math-v0", 3, "step", "boom")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    producer.started = 10
    kept = {p.name: p.read_bytes() for p in tmp_path.glob("*.jsonl")}
    state = record_state(tmp_path, recorder, errors, producer)

    for i in range(10, 20):  # what a process killed later wrote: several rotations, a torn metrics line
        recorder.episode(_trajectory(f"2-{i}"), step=2)
    errors.failed("Math-v0", 4, "step", "boom again")
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2}\n{"step": 3, "rew')
    assert recorder.shards > state["recorder"]["shards"]

    rewind_record(tmp_path, state)
    rewind_record(tmp_path, state)  # a resume killed while rewinding rewinds to the same place
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.jsonl")} == kept
    resumed, errors = EpisodeRecorder(tmp_path, max_bytes=2500), TaskErrors(3, tmp_path / "episode_errors.jsonl")
    producer = GroupProducer(
        SimpleNamespace(), SimpleNamespace(), None, resumed, errors, concurrency=1, reward_window=4
    )
    restore_record(state, resumed, errors, producer, step=1)
    resumed.close(step=1)
    assert producer.started == 10 and errors.total == {"Math-v0": 1} and resumed.episodes_done == 6
    outcomes = {e["group_id"]: e["group_outcome"] for e in read_episodes(tmp_path)}
    assert outcomes["1-9"] == "unfinished" and len(outcomes) == 6


def _config(tmp_path: Path, steps: int) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(
        "model: {name: tiny}\ntasks: [{env: Letters-v0}]\n"
        "rollout: {group_size: 4, max_new_tokens: 4, max_turns: 1, concurrent_groups: 3}\n"
        "algorithm: {groups_per_step: 2, lr: 0.01, filter_zero_variance: false}\n"
        f"budget: {{steps: {steps}, checkpoint_every: 2, checkpoint_keep: 2}}\nout_dir: {tmp_path / 'run'}\n"
    )
    return path


def _train(config: Path, resume: bool) -> subprocess.Popen:
    argv = [sys.executable, "-m", "envhub.cli.main", "train", str(config)] + (["--resume"] if resume else [])
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_at_a_random_point(proc: subprocess.Popen, run_dir: Path, steps: int, rng: random.Random) -> None:
    """SIGKILL the run at a point its progress defines, never its speed: once it logged step k (1-3 steps past
    where it resumed and past the rows a killed run left, which the resume rewinds), then after 0-8 more episode
    records (mid-rollout, mid-step, mid-checkpoint...) or at its next step, whichever comes first. k stays two
    steps short of the end, so the run is always caught alive, on a fast machine as on a slow one."""
    metrics, episodes = run_dir / "metrics.jsonl", run_dir / "episodes.jsonl"
    saved = latest_checkpoint(run_dir) if run_dir.exists() else None
    k = max(saved.step if saved else 0, len(_lines(metrics))) + rng.randint(1, 3)
    assert k <= steps - 2, "the test gives the run too few steps for its kills"
    more, deadline = rng.randint(0, 8), time.monotonic() + 300

    def wait_until(reached) -> None:
        while not reached():
            assert proc.poll() is None, f"the run ended before it was killed: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.02)

    wait_until(lambda: len(_lines(metrics)) >= k)
    logged = len(_lines(episodes))
    wait_until(lambda: len(_lines(episodes)) >= logged + more or len(_lines(metrics)) > k)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL  # killed, not finished: at least one more step was left to take


@pytest.mark.slow
async def test_runs_killed_at_random_points_resume_with_each_step_recorded_once(tmp_path):
    # 9 steps: each kill lands at most 3 steps past the previous one's next step (3, 7), two short of the end. Two
    # kills: the second kills a resumed run, which the last run resumes (a third cost CI a process start, ~10 s)
    steps, seed = 9, int(os.environ.get("ENVHUB_KILL_SEED", "7"))
    rng = random.Random(seed)
    config, run_dir = _config(tmp_path, steps), tmp_path / "run"
    for kill in range(2):
        _kill_at_a_random_point(_train(config, resume=kill > 0), run_dir, steps, rng)
    # the last run is never killed, so it resumes in this process: one of its own would only add its imports
    result = await Trainer(load_config(config)).run(resume=True)
    assert result.last_step == steps and not result.interrupted

    rows = [json.loads(line) for line in _lines(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), f"kill seed {seed}"
    assert rows[-1]["queue/consumed"] == 2 * steps and latest_checkpoint(run_dir).step == steps

    records = [json.loads(line) for line in _lines(run_dir / "episodes.jsonl")]
    outcomes = Counter(r["group_id"] for r in records if r["kind"] == "group")
    assert max(outcomes.values()) == 1, "a group was decided twice"
    trained = sorted(r["step"] for r in records if r["kind"] == "group" and r["outcome"] == "trained")
    assert trained == sorted(list(range(1, steps + 1)) * 2)  # every step trained its two groups, once
    episode_steps = [r["step"] for r in records if r["kind"] == "episode"]
    assert episode_steps == sorted(episode_steps)  # in order: nothing of a dead process's future remains
    assert all(e["group_outcome"] is not None for e in read_episodes(run_dir))

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run_dir / "tb"))
    board.Reload()
    assert [e.step for e in board.Scalars("batch_reward")] == list(range(1, steps + 1))
