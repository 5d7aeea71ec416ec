"""benchmarks/ci_tiny.py: one real short run of the shipped ci-tiny config through `envhub train`, reported in JSON."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_ci_tiny_run_reports_steps_evaluation_and_cpu_time(tmp_path):
    config = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    config["budget"] = {"steps": 2, "checkpoint_every": 2}
    config["evaluation"] = {"episodes": 2}
    (tmp_path / "short.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "ci_tiny.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/ci_tiny.py", "--config", str(tmp_path / "short.yaml"), "--seeds", "3"]
        + ["--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["seed"] == 3 and run["steps"] == 2 and run["stop_reason"] == "step budget spent"
    assert 0.0 <= run["eval_before"] <= 1.0 and 0.0 <= run["eval_after"] <= 1.0
    assert len(run["batch_reward_by_step"]) == 2 and run["cpu_s"] > 0 and "seed 3: 2 steps" in proc.stdout
