"""benchmarks/learning_parity.py: config overrides, the across-seed summary, and one real tiny run of both modes."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("learning_parity", ROOT / "benchmarks" / "learning_parity.py")
parity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parity)


def test_set_overrides_reach_the_config_and_mode_seed_steps_win():
    config = parity.build_config(
        str(ROOT / "configs" / "ci-tiny.yaml"),
        ["algorithm.lr=2e-3", "rollout.group_size=4"],
        mode="sync",
        seed=7,
        steps=3,
        eval_episodes=5,
        temperature=0.0,
    )
    assert config.algorithm.lr == pytest.approx(2e-3) and config.rollout.group_size == 4
    assert (config.algorithm.mode, config.seed, config.budget.steps, config.budget.checkpoint_every) == (
        "sync",
        7,
        3,
        3,
    )
    assert (config.evaluation.episodes, config.evaluation.temperature) == (5, 0.0)
    assert config.budget.max_time_s == 0  # equal steps: the config's time limit would cut the slower mode short
    timed = parity.build_config(
        str(ROOT / "configs" / "parity-smollm2.yaml"),
        [],
        mode="async",
        seed=0,
        steps=3,
        eval_episodes=5,
        temperature=0.0,
        max_time_s=60,
    )
    assert timed.budget.max_time_s == 60


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("algorithm.lr", "not KEY=VALUE"),
        ("seed.x=1", "'seed' is not a section"),
        ("algorithm.lrr=1", "lrr"),
    ],
)
def test_bad_overrides_are_named(assignment, message):
    with pytest.raises(ConfigError, match=message):
        parity.build_config(
            str(ROOT / "configs" / "ci-tiny.yaml"),
            [assignment],
            mode="sync",
            seed=0,
            steps=1,
            eval_episodes=1,
            temperature=1.0,
        )


def test_summary_pairs_seeds_and_reports_standard_errors():
    runs = {
        "sync": [{"eval_after": 0.5, "wall_s": 10.0, "steps": 4}, {"eval_after": 0.7, "wall_s": 12.0, "steps": 4}],
        "async": [{"eval_after": 0.6, "wall_s": 6.0, "steps": 4}, {"eval_after": 0.6, "wall_s": 5.0, "steps": 4}],
    }
    summary = parity.summarise(runs)
    assert summary["sync"]["eval_after_mean"] == pytest.approx(0.6)
    assert summary["sync"]["eval_after_se_over_seeds"] == pytest.approx(0.1)
    assert summary["after_async_minus_sync"] == pytest.approx(0.0)  # paired: +0.1 and -0.1
    assert summary["after_async_minus_sync_se"] == pytest.approx(0.1)
    assert summary["wall_async_over_sync"] == pytest.approx(5.5 / 11.0)
    assert parity.mean_se([0.3]) == (0.3, 0.0)


@pytest.mark.slow
def test_one_seed_of_both_modes_trains_and_writes_json(tmp_path):
    out = tmp_path / "parity.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "learning_parity.py"),
            "--steps",
            "2",
            "--seeds",
            "0",
            "--eval-episodes",
            "4",
            "--set",
            "rollout.group_size=4",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    for mode in ("sync", "async"):
        (run,) = report["runs"][mode]
        assert run["steps"] == 2 and 0.0 <= run["eval_after"] <= 1.0 and run["wall_s"] > 0
    assert report["overrides"] == ["rollout.group_size=4"]
    assert "async - sync final eval" in proc.stdout
