"""Does `envhub plan` predict the measured async/sync ratio? Checked on real runs of each workload.

For each workload, `envhub bench async --keep-runs DIR` trains it in sync and then async mode (fresh process per
workload), then the planner reads DIR/sync alone and predicts async (and sync, its replay). The measured ratio is
the pipeline's (first episode to last learner step: in one process the first run also pays the imports and model
loading, which the wall-clock ratio counts for the sync run only); the wall-clock ratio is reported beside it with
its own prediction (start-up taken from the sync run for both). The reverse prediction (DIR/async predicting
sync) is reported too. Writes JSON with every prediction error and the load average of the machine.

    python benchmarks/plan_check.py --out benchmarks/results/plan_check.json [--steps 12] [--workloads ...]
    python benchmarks/plan_check.py --out F --reuse DIR1 DIR2   # predict again from runs kept by --keep DIR

The machine is shared: each workload's load average is in the JSON, and one round is one sample of a noisy
measurement; `--reuse` gathers several rounds into one file with the spread of the measured and predicted ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
        "model": {
            "engine": vars(model.engine),
            "env": vars(model.env),
            "learner": vars(model.learner),
            "cpu": vars(model.cpu) if model.cpu else None,
        },
    }


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def stage_bound(run_dir: Path) -> dict[str, float]:
    """What a sync run's stage times imply for async when the trainer (engine, learner) and the envs each have their
    own resource and async only overlaps them: a step takes at least the busier of the two. Async also batches more
    requests per engine step, which this bound leaves out (the planner's `bounds_async_episodes_per_s` has it)."""
    record = read_run(run_dir)
    steps = len(record.steps)
    spans = [s for e in record.episodes for s in e.spans]
    generating = busy_seconds([(s.start, s.end) for s in spans if s.kind == "generate"])
    envs = busy_seconds([(s.start, s.end) for s in spans if s.kind in ("acquire", "reset", "step", "final")])
    learner = sum(s.learner_s + s.publish_s for s in record.steps)
    trainer = (generating + learner) / steps
    pipeline = (record.wall_s - record.startup_s) / steps
    return {
        "sync_step_s": round(pipeline, 3),
        "trainer_busy_per_step_s": round(trainer, 3),
        "env_busy_per_step_s": round(envs / steps, 3),
        "overlap_only_bound": round(pipeline / max(trainer, envs / steps), 3),
    }


def check(workload: str, steps: int, root: Path, trials: int, reuse: bool = False) -> dict[str, Any]:
    """Measure one workload both ways (or reuse the kept runs), predict from each run, and compare."""
    keep = root / workload
    load_before = os.getloadavg()
    bench = json.loads((keep / "bench.json").read_text()) if reuse else run_bench(workload, steps, keep)
    if reuse:
        load_before = bench["load_average"]
        steps = bench["sync"]["steps"]
    from_sync = predict_ratio(keep / "sync", trials)
    from_async = predict_ratio(keep / "async", trials)
    measured_ratio = bench["pipeline_speedup"]
    return {
        "workload": workload,
        "description": bench["latency"],
        "steps": steps,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in (bench["load_average"] if reuse else os.getloadavg())],
        "measured": {
            "async_over_sync": measured_ratio,
            "wall_async_over_sync": bench["speedup"],
            "sync": bench["sync"],
            "async": bench["async"],
        },
        "prediction_error": round(from_sync["predicted_async_over_sync"] / measured_ratio - 1, 4),
        "wall_prediction_error": round(from_sync["predicted_wall_async_over_sync"] / bench["speedup"] - 1, 4),
        "reverse_prediction_error": round(from_async["predicted_async_over_sync"] / measured_ratio - 1, 4),
        "stage_bound": stage_bound(keep / "sync"),
        "from_sync_run": from_sync,
        "from_async_run": from_async,
    }


def summary(rounds: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per workload over the rounds: measured and predicted ratios, their means, and the mean's error."""
    out = {}
    for workload in dict.fromkeys(r["workload"] for round_ in rounds for r in round_):
        rows = [r for round_ in rounds for r in round_ if r["workload"] == workload]
        measured_ratios = [r["measured"]["async_over_sync"] for r in rows]
        predicted = [r["from_sync_run"]["predicted_async_over_sync"] for r in rows]
        mean_measured, mean_predicted = statistics.fmean(measured_ratios), statistics.fmean(predicted)
        out[workload] = {
            "rounds": len(rows),
            "measured": measured_ratios,
            "predicted_from_sync": predicted,
            "errors": [r["prediction_error"] for r in rows],
            "mean_measured": round(mean_measured, 3),
            "mean_predicted": round(mean_predicted, 3),
            "error_of_means": round(mean_predicted / mean_measured - 1, 4),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="plan_check.json")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--keep", default=None, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--reuse", nargs="+", default=None, metavar="DIR", help="predict from runs kept earlier")
    args = parser.parse_args()
    if args.reuse:
        rounds = [
            [
                check(w, args.steps, Path(d), args.trials, reuse=True)
                for w in args.workloads
                if (Path(d) / w / "bench.json").is_file()
            ]
            for d in args.reuse
        ]
    else:
        with tempfile.TemporaryDirectory(prefix="envhub-plan-check-") as tmp:
            rounds = [[check(w, args.steps, Path(args.keep or tmp), args.trials) for w in args.workloads]]
    print(
        f"{'workload':<16} {'measured':>9} {'predicted':>10} {'error':>7} {'reverse':>8} {'wall err':>9} {'load':>6} "
        f"{'sync CPUs busy':>15}"
    )
    for r in (r for round_ in rounds for r in round_):
        print(
            f"{r['workload']:<16} {r['measured']['async_over_sync']:>9} "
            f"{r['from_sync_run']['predicted_async_over_sync']:>10} {r['prediction_error']:>+7.1%} "
            f"{r['reverse_prediction_error']:>+8.1%} {r['wall_prediction_error']:>+9.1%} "
            f"{r['load_average_after'][0]:>6} {r['measured']['sync'].get('machine_busy', float('nan')):>15.0%}"
        )
    report = {"cpus": os.cpu_count(), "summary": summary(rounds), "rounds": rounds}
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
