"""`envhub bench all --quick`: every section measured in one run, written as report.json and report.md."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[2]
# On the vLLM tests' worker, one after another: its 8 Ray actors starting beside vLLM's start-up and the vLLM
# training runs took 283 s of this test in a parallel suite (105 s beside lighter tests) and once scaled 8 workers
# to 0.93x of one.
pytestmark = pytest.mark.xdist_group("vllm")


@pytest.mark.slow
def test_bench_all_quick_writes_every_section_with_same_run_ratios(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", "bench", "all", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    steps = report["env_steps"]
    assert all(steps[e]["steps_per_s"] > 100 for e in ("Sokoban-v0", "FrozenLake-v0", "Wordle-v0", "Math-v0"))
    measured = [b for b in report["sandboxes"].values() if "exec_roundtrip" in b]
    assert measured and all(
        b["exec_over_reference"] > 0 and b["warm_acquire"]["p50_ms"] <= b["cold_start"]["p50_ms"] for b in measured
    )
    engine = report["engine"]
    assert engine["engine_tokens_per_s"] > 0 and engine["speedup"] == pytest.approx(
        engine["engine_tokens_per_s"] / engine["generate_loop_tokens_per_s"], rel=0.02
    )
    speed = report["async_vs_sync"]
    assert speed["sync"]["steps"] == speed["async"]["steps"] and speed["speedup"] > 0
    workers = report["worker_scaling"]["workers"]
    assert list(workers) == ["1", "2"] and all(w["episodes"] == 8 for w in workers.values())
    # scaling out runs more episodes at once: every worker's slots fill (2 each). Its speedup is a benchmark figure
    # (benchmarks/results/report), not asserted here: beside the rest of the suite on 2 cores one run measured 1.36x
    assert [w["peak_in_flight"] for w in workers.values()] == [2, 4]
    assert workers["1"]["speedup_vs_1"] == 1.0 and all(w["speedup_vs_1"] > 0 for w in workers.values())
    markdown = (tmp_path / "report.md").read_text()
    for heading in (
        "## Env steps/s",
        "## Sandboxes",
        "## Engine tokens/s",
        "## Async vs sync GRPO",
        "## Ray env workers",
    ):
        assert heading in markdown
