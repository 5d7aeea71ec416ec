"""benchmarks/demo_gain.py: the RL phase's gain over the SFT checkpoint, paired per held-out episode."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("demo_gain", ROOT / "benchmarks" / "demo_gain.py")
demo_gain = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo_gain)


def stage(run: Path, name: str, rewards: dict[tuple[str, int], float]) -> None:
    (run / name).mkdir(parents=True)
    lines = [json.dumps({"env_id": task, "seed": seed, "reward": r}) for (task, seed), r in rewards.items()]
    (run / name / "episodes.jsonl").write_text("\n".join(lines) + "\n")


def test_the_gain_is_paired_per_episode_and_overall_is_the_mean_over_tasks(tmp_path):
    sft = {("A", 0): 0.0, ("A", 1): 1.0, ("A", 2): 0.0, ("B", 0): 1.0, ("B", 1): 1.0}
    after = {("A", 0): 1.0, ("A", 1): 1.0, ("A", 2): 1.0, ("B", 0): 1.0, ("B", 1): 1.0, ("B", 9): 0.0}
    stage(tmp_path, "eval-sft", sft)
    stage(tmp_path, "eval-after", after)  # ("B", 9) was not evaluated after SFT: left out
    result = demo_gain.paired_gain(tmp_path)
    a, b = result["tasks"]["A"], result["tasks"]["B"]
    assert (a["episodes"], a["sft"], a["after"], a["gain"]) == (3, pytest.approx(1 / 3), 1.0, pytest.approx(2 / 3))
    # differences 1, 0, 1: sd sqrt(1/3), SE sqrt(1/3) / sqrt(3) = 1/3
    assert a["gain_se"] == pytest.approx(1 / 3)
    assert (b["episodes"], b["gain"], b["gain_se"]) == (2, 0.0, 0.0)
    overall = result["overall"]
    assert overall["gain"] == pytest.approx(1 / 3) and overall["gain_se"] == pytest.approx(1 / 6)
    assert overall["sft"] == pytest.approx((1 / 3 + 1.0) / 2) and overall["episodes"] == 5


def test_the_verdict_needs_the_target_and_two_of_the_larger_standard_error():
    def run(gain, se):
        return {"overall": {"gain": gain, "gain_se": se, "sft": 0.5, "after": 0.5 + gain}}

    steady = demo_gain.summarize([run(0.12, 0.03), run(0.13, 0.03), run(0.11, 0.03)], 0.10)
    assert steady["met"] and steady["mean_gain"] == pytest.approx(0.12)
    assert steady["se_episodes"] == pytest.approx(math.sqrt(3 * 0.03**2) / 3)
    assert not demo_gain.summarize([run(0.08, 0.01)] * 3, 0.10)["met"]  # below the target
    single = demo_gain.summarize([run(0.3, 0.05)], 0.10)
    assert single["se_seeds"] is None and single["met"]  # one run: its episodes' SE alone; strict JSON (no NaN)
    json.dumps(single, allow_nan=False)
    spread = demo_gain.summarize([run(0.0, 0.01), run(0.05, 0.01), run(0.40, 0.01)], 0.10)
    assert spread["se_seeds"] > 0.1 and not spread["met"]  # the seeds disagree: 0.15 is within 2 SE of 0


def test_a_run_without_common_episodes_is_one_clear_error(tmp_path):
    stage(tmp_path, "eval-sft", {("A", 0): 1.0})
    stage(tmp_path, "eval-after", {("A", 1): 1.0})
    with pytest.raises(SystemExit, match="no held-out episode was evaluated both after SFT and after RL"):
        demo_gain.paired_gain(tmp_path)


@pytest.mark.slow
def test_a_short_run_with_an_sft_stage_reports_the_paired_gain(tmp_path):
    config = {
        "model": {"name": "tiny"},
        "tasks": [{"env": "Letters-v0", "kwargs": {"letters": "aeiou"}}],
        "rollout": {"group_size": 2, "max_new_tokens": 8, "max_turns": 1},
        "algorithm": {"mode": "sync", "groups_per_step": 1, "filter_zero_variance": False},
        "sft": {"collect": 2, "epochs": 1, "lr": 1e-3},
        "evaluation": {"episodes": 2},
        "budget": {"steps": 1},
    }
    (tmp_path / "short.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "gain.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/demo_gain.py", "--config", str(tmp_path / "short.yaml"), "--seeds", "4"]
        + ["--keep", str(tmp_path / "runs"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert run["seed"] == 4 and run["steps"] == 1 and run["overall"]["episodes"] == 2
    assert run["tasks"]["Letters-v0"]["gain"] == pytest.approx(run["overall"]["after"] - run["overall"]["sft"])
    assert any(line.startswith("sft: ") for line in run["stages"]) and "mean over 1 runs" in proc.stdout
    again = subprocess.run(
        [sys.executable, "benchmarks/demo_gain.py", "--reuse", run["run_dir"], "--out", str(tmp_path / "r.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        again.returncode == 0 and json.loads((tmp_path / "r.json").read_text())["runs"][0]["overall"] == run["overall"]
    )
