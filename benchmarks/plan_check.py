"""Does `envhub plan` predict the measured async/sync ratio? Checked on real runs of each workload.

For each workload, `envhub bench async --keep-runs DIR` trains it in sync and then async mode (fresh process per
workload), then the planner reads DIR/sync alone and predicts async (and sync, its replay). The measured ratio is
the pipeline's (first episode to last learner step: in one process the first run also pays the imports and model
loading, which the wall-clock ratio counts for the sync run only); the wall-clock ratio is reported beside it with
its own prediction (start-up taken from the sync run for both). The reverse prediction (DIR/async predicting
sync) is reported too. Writes JSON with every prediction error and the load average of the machine.

    python benchmarks/plan_check.py --out benchmarks/results/plan_check.json [--steps 12] [--workloads ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from envhub.trainer.plan.model import fit_model
from envhub.trainer.plan.record import read_run
from envhub.trainer.plan.report import bounds, measured, predict, record_config

WORKLOADS = ("latency", "sandbox", "sandbox-pinned")


def run_bench(workload: str, steps: int, keep: Path) -> dict[str, Any]:
    """`envhub bench async` for one workload in a fresh process; returns its JSON."""
    out = keep / "bench.json"
    code = (
        "from envhub.trainer.bench import main; "
        f"main(out={str(out)!r}, steps={steps}, workload={workload!r}, keep_runs={str(keep)!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    return json.loads(out.read_text())


def predict_ratio(run_dir: Path, trials: int) -> dict[str, Any]:
    """From one kept run alone: the other mode's throughput over this mode's (pipeline and wall clock)."""
    record = read_run(run_dir)
    model = fit_model(record)
    other = "async" if record.mode == "sync" else "sync"
    own = predict(model, record_config(record), trials, record.startup_s)
    then = predict(model, record_config(record, mode=other), trials, record.startup_s)
    ratio = then["episodes_per_s"] / own["episodes_per_s"]
    wall_ratio = own["wall_s"] / then["wall_s"]
    if other == "sync":
        ratio, wall_ratio = 1 / ratio, 1 / wall_ratio
    sync_groups = (own if record.mode == "sync" else then)["group_s"]["mean"]
    return {
        "from": record.mode,
        "predicted_async_over_sync": round(ratio, 3),
        "predicted_wall_async_over_sync": round(wall_ratio, 3),
        "replay_error": round(own["episodes_per_s"] / measured(record)["episodes_per_s"] - 1, 4),
        "predicted": {record.mode: own, other: then},
        "bounds_async_episodes_per_s": bounds(model, record_config(record, mode="async"), sync_groups),
        "model_notes": model.notes,
        "model": {"engine": vars(model.engine), "env": vars(model.env), "learner": vars(model.learner)},
    }


def check(workload: str, steps: int, root: Path, trials: int) -> dict[str, Any]:
    """Measure one workload both ways, predict from each run, and compare."""
    keep = root / workload
    load_before = os.getloadavg()
    bench = run_bench(workload, steps, keep)
    from_sync = predict_ratio(keep / "sync", trials)
    from_async = predict_ratio(keep / "async", trials)
    measured_ratio = bench["pipeline_speedup"]
    return {
        "workload": workload,
        "description": bench["latency"],
        "steps": steps,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "measured": {
            "async_over_sync": measured_ratio,
            "wall_async_over_sync": bench["speedup"],
            "sync": bench["sync"],
            "async": bench["async"],
        },
        "prediction_error": round(from_sync["predicted_async_over_sync"] / measured_ratio - 1, 4),
        "wall_prediction_error": round(from_sync["predicted_wall_async_over_sync"] / bench["speedup"] - 1, 4),
        "reverse_prediction_error": round(from_async["predicted_async_over_sync"] / measured_ratio - 1, 4),
        "from_sync_run": from_sync,
        "from_async_run": from_async,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="plan_check.json")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--keep", default=None, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envhub-plan-check-") as tmp:
        root = Path(args.keep or tmp)
        results = [check(w, args.steps, root, args.trials) for w in args.workloads]
    print(f"{'workload':<16} {'measured':>9} {'predicted':>10} {'error':>7} {'reverse':>8} {'wall err':>9} {'load':>6}")
    for r in results:
        print(
            f"{r['workload']:<16} {r['measured']['async_over_sync']:>9} "
            f"{r['from_sync_run']['predicted_async_over_sync']:>10} {r['prediction_error']:>+7.1%} "
            f"{r['reverse_prediction_error']:>+8.1%} {r['wall_prediction_error']:>+9.1%} "
            f"{r['load_average_after'][0]:>6}"
        )
    Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "workloads": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
