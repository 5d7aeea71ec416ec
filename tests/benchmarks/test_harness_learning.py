"""benchmarks/harness_learning.py: the committed result says what docs/harnesses.md claims, and a config it cannot
measure is refused before anything runs."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "harness_learning.json"


def test_the_committed_run_beats_its_start_beyond_2_se_within_30_cpu_minutes():
    result = json.loads(RESULT.read_text())
    assert result["harness"] == "openai-agents" and result["before"]["episodes"] == result["after"]["episodes"] == 128
    gain = result["after"]["mean"] - result["before"]["mean"]
    assert abs(gain - result["gain"]) < 1e-3 and gain > 2 * result["gain_se"] and result["beats_start_by_2se"]
    assert result["cpu_minutes"] <= 30 and result["within_30_cpu_minutes"]
    docs = (ROOT / "docs" / "harnesses.md").read_text()
    before, after = result["before"], result["after"]
    assert f"{before['mean']:.3f} ± {before['se']:.3f} -> {after['mean']:.3f} ± {after['se']:.3f}" in docs
    assert f"{result['cpu_minutes']} CPU-minutes" in docs


def test_a_config_without_exactly_one_harness_task_is_refused(tmp_path):
    config = tmp_path / "two.yaml"
    config.write_text(json.dumps({"model": {"name": "tiny"}, "tasks": [{"env": "Letters-v0"}]}))
    command = [sys.executable, str(ROOT / "benchmarks" / "harness_learning.py"), "--config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0 and "exactly one task, played by a harness" in done.stderr
