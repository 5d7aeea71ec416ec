"""benchmarks/gpu_check.py: the arithmetic its JSON reports (the run itself needs a GPU, or minutes of CPU)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_the_recipe_passes_within_twenty_percent_of_the_dry_run_on_either_side():
    gib = 2**30
    assert gpu_check.memory_verdict(60 * gib, 54.8 * gib) == {"ratio": 1.095, "within": True, "tolerance": 0.2}
    assert gpu_check.memory_verdict(66 * gib, 55 * gib)["within"]  # 1.2 exactly
    assert not gpu_check.memory_verdict(67 * gib, 55 * gib)["within"]
    assert not gpu_check.memory_verdict(40 * gib, 55 * gib)["within"]  # the plan overstates by more than 20%
    assert gpu_check.memory_verdict(1.0, 0.0) == {"ratio": None, "within": False, "tolerance": 0.2}


def test_the_summary_sets_each_figure_against_its_reference_and_keeps_partial_stages():
    assert gpu_check.copy_gbps(2 * 10**9, 1.0) == 4.0  # bytes read and written
    stages = {
        "environment": {"status": "ok", "result": {"bf16_matmul_tflops": 800.0, "copy_gbps": 4000.0}},
        "engine": {
            "status": "ok",
            "result": {
                "tokens_per_s": 25000.0,
                "decode": {"achieved_gbps": 1000.0, "fraction_of_bandwidth_bound": 0.21},
            },
        },
        "learner": {"status": "ok", "result": {"trained_tokens_per_s": 9000.0, "tflops": 200.0}},
        "recipe": {"status": "timeout", "result": {"steps": [{"step": 1}]}},  # stopped at its cap before a verdict
    }
    summary = gpu_check.summarize(stages)
    assert summary["stages"] == {"environment": "ok", "engine": "ok", "learner": "ok", "recipe": "timeout"}
    assert summary["engine_meets_goal"] and summary["engine_fraction_of_bandwidth_bound"] == 0.21
    assert summary["engine_fraction_of_measured_copy"] == 0.25
    assert summary["learner_share_of_bf16_matmul"] == 0.25
    assert "recipe_memory_ratio" not in summary
    stages["engine"]["result"]["tokens_per_s"] = 19999.0
    stages["recipe"] = {"status": "ok", "result": {"memory": {"ratio": 1.31, "within": False}}}
    summary = gpu_check.summarize(stages)
    assert not summary["engine_meets_goal"] and summary["recipe_memory_ratio"] == pytest.approx(1.31)
    assert summary["recipe_memory_within"] is False
    assert gpu_check.summarize({"environment": {"status": "error"}}) == {"stages": {"environment": "error"}}


def test_the_report_is_replaced_whole_and_a_failed_stage_keeps_its_log_tail(tmp_path):
    out = tmp_path / "gpu_check.json"
    gpu_check.write_json(out, {"stages": {}})
    gpu_check.write_json(out, {"stages": {"environment": {"status": "ok"}}})
    assert json.loads(out.read_text())["stages"]["environment"]["status"] == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_check.json"]  # no temporary file left
    log = tmp_path / "stage.log"
    log.write_text("\n".join(f"line {i}" for i in range(100)) + "\nRuntimeError: CUDA out of memory\n")
    tail = gpu_check.log_tail(log, lines=3)
    assert tail.splitlines() == ["line 98", "line 99", "RuntimeError: CUDA out of memory"]
    assert gpu_check.log_tail(tmp_path / "missing.log") == ""
