"""benchmarks/eval_baselines.py: README's baseline tables are the committed summaries, and every summary has the set
that regenerates it; one real set runs through `envhub eval` and is kept."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results/eval-baselines"


spec = importlib.util.spec_from_file_location("eval_baselines", ROOT / "benchmarks" / "eval_baselines.py")
eval_baselines = importlib.util.module_from_spec(spec)
spec.loader.exec_module(eval_baselines)


def test_readme_shows_the_committed_summaries_row_for_row():
    readme = (ROOT / "README.md").read_text()
    for table in eval_baselines.TABLES:
        rows = eval_baselines.readme_rows(RESULTS, table)
        assert rows and all(row in readme for row in rows), [row for row in rows if row not in readme]


def test_every_committed_summary_has_the_set_that_regenerates_it_and_success_is_the_envs():
    assert {p.stem for p in RESULTS.glob("*.json")} == set(eval_baselines.SETS)
    expert = json.loads((RESULTS / "suites-expert.json").read_text())["minigrid-BabyAI-GoToLocal-v0"]
    assert expert["mean_reward"] < 1.0 and expert["pass_at_k"]["1"] == 1.0  # MiniGrid's reward falls with steps
    assert eval_baselines.cell(expert).endswith("1.00 (100 ± 0)")


def test_a_set_runs_as_a_user_would_and_its_summary_is_kept(tmp_path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/eval_baselines.py", "--sets", "ta-random", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "ta-random.json").read_text())
    assert {entry["episodes"] for entry in summary.values()} == {20}
    assert "| `ta-TicTacToe-v0#seat0` |" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "benchmarks/eval_baselines.py", "--sets", "nope"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown set(s) nope: choose from random" in bad.stderr
