"""What the demo's RL phase adds over its SFT warm start: `envhub train configs/demo.yaml` once per seed, the held-out
reward before, after SFT and after RL, and the RL gain over SFT with its standard errors, in one JSON file.

    python benchmarks/demo_gain.py [--config configs/demo.yaml] [--seeds 0,1,2] [--keep DIR]
                                   [--out benchmarks/results/demo_gain.json]
    python benchmarks/demo_gain.py --reuse RUN_DIR [RUN_DIR ...]     # the summary of finished runs only

The gain is paired: the SFT checkpoint and the final policy play the same held-out seeds (greedy), so each
episode's reward after RL is compared with the same episode's after SFT (eval-sft/ and eval-after/). Per run,
overall = mean over tasks of the per-task mean, as in eval.json; its standard error comes from the per-episode
differences. Over the seeds two standard errors are given: from the episodes (the runs' errors combined) and from
the seeds (the spread of the runs' gains, sd / sqrt(n)); the verdict takes the larger. Resolved when the mean gain is
at least --target (0.10) and beyond two of those standard errors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # sibling benchmark scripts
from ci_tiny import envhub_train, stop_reason  # noqa: E402


def episode_rewards(stage_dir: Path) -> dict[tuple[str, int], float]:
    """(task, held-out seed) -> reward of one evaluation stage's recorded episodes."""
    rewards = {}
    for line in (stage_dir / "episodes.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rewards[(row["env_id"], int(row["seed"]))] = float(row["reward"])
    return rewards


def paired_gain(run_dir: Path) -> dict[str, Any]:
    """Per task and overall: mean reward after SFT and after RL on the same seeds, their paired gain and its SE."""
    sft, after = episode_rewards(run_dir / "eval-sft"), episode_rewards(run_dir / "eval-after")
    common = sorted(set(sft) & set(after))
    if not common:
        raise SystemExit(f"{run_dir}: no held-out episode was evaluated both after SFT and after RL")
    tasks: dict[str, Any] = {}
    for task in sorted({t for t, _ in common}):
        diffs = [after[k] - sft[k] for k in common if k[0] == task]
        n = len(diffs)
        tasks[task] = {
            "episodes": n,
            "sft": statistics.fmean(sft[k] for k in common if k[0] == task),
            "after": statistics.fmean(after[k] for k in common if k[0] == task),
            "gain": statistics.fmean(diffs),
            "gain_se": statistics.stdev(diffs) / math.sqrt(n) if n > 1 else 0.0,
        }
    count = len(tasks)
    overall = {
        "episodes": len(common),
        "sft": statistics.fmean(t["sft"] for t in tasks.values()),
        "after": statistics.fmean(t["after"] for t in tasks.values()),
        "gain": statistics.fmean(t["gain"] for t in tasks.values()),
        "gain_se": math.sqrt(sum(t["gain_se"] ** 2 for t in tasks.values())) / count,
    }
    return {"tasks": tasks, "overall": overall}


def summarize(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """The mean gain over the runs, its two standard errors and the verdict."""
    gains = [r["overall"]["gain"] for r in runs]
    mean = statistics.fmean(gains)
    se_episodes = math.sqrt(sum(r["overall"]["gain_se"] ** 2 for r in runs)) / len(runs)
    se_seeds = statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else None  # one run: no spread
    se = max(se_episodes, se_seeds) if se_seeds is not None else se_episodes
    return {
        "runs": len(runs),
        "mean_sft": statistics.fmean(r["overall"]["sft"] for r in runs),
        "mean_after": statistics.fmean(r["overall"]["after"] for r in runs),
        "mean_gain": mean,
        "se_episodes": se_episodes,
        "se_seeds": se_seeds,
        "target": target,
        "met": mean >= target and mean > 2 * se,
    }


def train(config: dict[str, Any], seed: int, work: Path) -> dict[str, Any]:
    """One `envhub train` run of `config` with `seed`; its stages' timing and the paired gain."""
    run = envhub_train(config, seed, work)
    return describe(run.out, seed, run.wall_s, run.stdout, run.load_avg_1min)


def describe(out: Path, seed: int | None, wall: float | None, stdout: str, load: list[float] | None) -> dict:
    """What a finished run directory shows: steps, stop reason, stage lines and the paired gain."""
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    stages = [line for line in stdout.splitlines() if line.startswith(("eval ", "sft: "))]
    return {
        "seed": seed,
        "run_dir": str(out),
        "steps": len(metrics),
        "rl_s": round(metrics[-1]["elapsed_s"] - metrics[0]["elapsed_s"] + metrics[0]["step_s"], 1) if metrics else 0,
        "stop_reason": stop_reason(stdout),
        "stages": stages,
        "wall_s": round(wall, 1) if wall is not None else None,
        "load_avg_1min": load,
        **paired_gain(out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--keep", help="keep the run directories here (default: a temporary directory)")
    parser.add_argument("--reuse", nargs="+", help="summarize these finished run directories instead of training")
    parser.add_argument("--target", type=float, default=0.10, help="the gain over SFT to reach")
    parser.add_argument("--out", default="benchmarks/results/demo_gain.json")
    args = parser.parse_args()
    report: dict[str, Any] = {"config": args.config, "cpu_count": os.cpu_count(), "runs": []}
    if args.reuse:
        report["runs"] = [describe(Path(d), None, None, "", None) for d in args.reuse]
    else:
        config = yaml.safe_load((ROOT / args.config).read_text())
        with tempfile.TemporaryDirectory(prefix="envhub-demo-gain-") as tmp:
            work = Path(args.keep or tmp)
            work.mkdir(parents=True, exist_ok=True)
            for seed in (int(s) for s in args.seeds.split(",")):
                run = train(config, seed, work)
                report["runs"].append(run)
                Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
                o = run["overall"]
                print(
                    f"seed {seed}: {run['steps']} RL steps in {run['rl_s']} s, wall {run['wall_s']} s; overall "
                    f"{o['sft']:.3f} after SFT -> {o['after']:.3f} after RL, "
                    f"gain {o['gain']:+.3f} +- {o['gain_se']:.3f}",
                    flush=True,
                )
    report["summary"] = summarize(report["runs"], args.target)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    s = report["summary"]
    seeds = f"{s['se_seeds']:.3f}" if s["se_seeds"] is not None else "none with one run"
    print(
        f"mean over {s['runs']} runs: {s['mean_sft']:.3f} after SFT -> {s['mean_after']:.3f} after RL, gain "
        f"{s['mean_gain']:+.3f} (SE {s['se_episodes']:.3f} from the episodes, {seeds} from the seeds): "
        f"{'met' if s['met'] else 'NOT met'} (target +{s['target']:.2f} beyond 2 SE)"
    )


if __name__ == "__main__":
    main()
