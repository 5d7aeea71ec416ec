"""benchmarks/plan_check.py: the CPU bound a sync run's machine use puts on async."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("plan_check", ROOT / "benchmarks" / "plan_check.py")
plan_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plan_check)


def bench(busy: float | None) -> dict:
    sync = {"steps": 10} if busy is None else {"machine_busy": busy, "trainer_cpu_s": 15.0, "machine_cpu_s": 45.0}
    return {"sync": sync}


def test_a_busy_machine_caps_the_predicted_speedup():
    bound = plan_check.cpu_bound(bench(0.8), predicted=1.5, measured_ratio=1.0)
    assert bound["async_over_sync_at_most"] == 1.25 and bound["capped_prediction"] == 1.25
    assert bound["capped_prediction_error"] == 0.25 and bound["sync_trainer_cpu_share"] == 0.333


def test_an_idle_machine_leaves_the_prediction_alone_and_old_runs_have_no_bound():
    bound = plan_check.cpu_bound(bench(0.2), predicted=3.0, measured_ratio=3.2)
    assert bound["capped_prediction"] == 3.0 and bound["capped_prediction_error"] == round(3.0 / 3.2 - 1, 4)
    assert plan_check.cpu_bound(bench(None), predicted=3.0, measured_ratio=3.2) == {}
