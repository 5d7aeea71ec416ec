"""Does async GRPO learn as well as sync? The same config trained in both modes for the same steps, in one run.

    python benchmarks/learning_parity.py [--config configs/ci-tiny.yaml] [--steps 16] [--seeds 0,1,2]
        [--eval-episodes 64] [--temperature 1.0] [--set algorithm.lr=0.002 ...]
        [--out benchmarks/results/learning_parity.json]

For every seed, each mode starts from the same initial weights and seed (the config's `seed` is replaced), trains
`--steps` learner steps, and its final policy is evaluated on the same held-out seeds (RUN_DIR/eval.json, "before"
and "after"). One run of one seed says little: a policy can collapse onto one reply and the evaluation then has no
spread at all, so the comparison is over seeds: the mean final reward of each mode, its standard error across seeds,
and the paired difference async - sync with its standard error. Also reported: last training batch reward, wall time
and mean staleness of each mode, and the async/sync wall ratio.

`--temperature` is the evaluation temperature: 1.0 (default) measures the policy's expected reward, needed for
Letters-v0 whose prompt does not vary with the seed (greedy would be one sample); 0 evaluates greedily.
`--set KEY=VALUE` overrides any config field by its dotted path (the value is read as YAML).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from envhub.errors import ConfigError
from envhub.trainer.config import TrainConfig, config_from_dict
from envhub.trainer.train import Trainer

MODES = ("sync", "async")


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Set `a.b.c=value` in a nested config dict; the value is parsed as YAML (so 2e-6, true, [1, 2] work)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r} is not KEY=VALUE", hint="e.g. --set algorithm.lr=0.002")
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"--set {assignment!r}: {part!r} is not a section",
                hint="name a field inside a section, e.g. rollout.group_size",
            )
        node = child
    node[leaf] = yaml.safe_load(raw)


def build_config(
    path: str,
    overrides: list[str],
    *,
    mode: str,
    seed: int,
    steps: int,
    eval_episodes: int,
    temperature: float,
    max_time_s: float = 0.0,
) -> TrainConfig:
    """The config file with --set overrides applied, then this run's mode, seed, steps, time limit and evaluation.

    The config's own `budget.max_time_s` is replaced by `max_time_s` (0 = none): a wall-time limit would stop the
    slower mode after fewer steps, and the comparison is at equal steps.
    """
    data = yaml.safe_load(Path(path).read_text()) or {}
    for assignment in overrides:
        apply_override(data, assignment)
    data["seed"] = seed
    data.setdefault("algorithm", {})["mode"] = mode
    budget = data.setdefault("budget", {})
    budget["steps"] = steps
    budget["checkpoint_every"] = steps
    budget["max_time_s"] = max_time_s
    evaluation = data.setdefault("evaluation", {})
    evaluation["episodes"] = eval_episodes
    evaluation["temperature"] = temperature
    return config_from_dict(data)


async def train_mode(config: TrainConfig, out_dir: Path) -> dict[str, Any]:
    """Train one mode and return its evaluation and timings."""
    started = time.monotonic()
    result = await Trainer(config, out_dir=out_dir).run()
    wall = time.monotonic() - started
    report = json.loads((out_dir / "eval.json").read_text())
    overall = report["overall"]
    last = result.history[-1] if result.history else {}
    return {
        "seed": config.seed,
        "steps": result.last_step,
        "wall_s": round(wall, 2),
        "train_s": round(result.wall_s, 2),
        "eval_before": overall["before"],
        "eval_sft": overall.get("sft"),
        "eval_after": overall["after"],
        "eval_after_se": overall.get("after_se"),
        "per_task_after": {task: row["after"] for task, row in report.items() if task != "overall"},
        "last_batch_reward": last.get("batch_reward"),
        "mean_staleness": sum(r.get("staleness", 0) for r in result.history) / max(1, len(result.history)),
        "batch_reward_by_step": [round(r.get("batch_reward", 0.0), 4) for r in result.history],
    }


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Across seeds: each mode's mean final reward and wall time, and the paired async - sync difference."""
    summary: dict[str, Any] = {}
    for mode in MODES:
        after, se = mean_se([r["eval_after"] for r in runs[mode]])
        wall, _ = mean_se([r["wall_s"] for r in runs[mode]])
        summary[mode] = {
            "eval_after_mean": after,
            "eval_after_se_over_seeds": se,
            "wall_s_mean": wall,
            "steps": [r["steps"] for r in runs[mode]],
        }
    diffs = [a["eval_after"] - s["eval_after"] for s, a in zip(runs["sync"], runs["async"])]
    diff, diff_se = mean_se(diffs)
    summary["after_async_minus_sync"] = diff
    summary["after_async_minus_sync_se"] = diff_se
    summary["wall_async_over_sync"] = summary["async"]["wall_s_mean"] / summary["sync"]["wall_s_mean"]
    return summary


def parse_args() -> argparse.Namespace:
    """The command line, with the seeds parsed into `args.seed_list`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/ci-tiny.yaml")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds, e.g. 0,1,2")
    parser.add_argument("--eval-episodes", type=int, default=64, help="held-out evaluation episodes per task")
    parser.add_argument("--temperature", type=float, default=1.0, help="evaluation temperature (0 = greedy)")
    parser.add_argument(
        "--max-time-s",
        type=float,
        default=0.0,
        help="wall-time limit per run (default none: both modes train the same steps)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field by dotted path, e.g. algorithm.lr=0.002 (repeatable)",
    )
    parser.add_argument("--out", default="benchmarks/results/learning_parity.json")
    args = parser.parse_args()
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2")
    if not args.seed_list:
        parser.error("--seeds: give at least one seed")
    return args


def run_all(configs: dict, seeds: list[int], header: dict[str, Any], path: Path) -> dict[str, list[dict[str, Any]]]:
    """Train every (mode, seed); the JSON is rewritten after each run, so an interrupted benchmark keeps its runs."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="envhub-parity-") as tmp:
        for seed in seeds:
            for mode in MODES:
                run = asyncio.run(train_mode(configs[mode, seed], Path(tmp) / f"{mode}-{seed}"))
                runs[mode].append(run)
                path.write_text(json.dumps({**header, "complete": False, "runs": runs}, indent=2))
                print(
                    f"seed {seed} {mode:<5} steps {run['steps']:>3}  eval {run['eval_before']:.3f} -> "
                    f"{run['eval_after']:.3f}"
                    f"  last batch {run['last_batch_reward'] or 0:.3f}  wall {run['wall_s']:.1f} s"
                    f"  staleness {run['mean_staleness']:.2f}",
                    flush=True,
                )
    return runs


def print_summary(summary: dict[str, Any]) -> None:
    """Each mode's final evaluation and the paired difference."""
    for mode in MODES:
        row = summary[mode]
        print(
            f"{mode:<6} final eval {row['eval_after_mean']:.3f} ± {row['eval_after_se_over_seeds']:.3f} (se over seeds)"
            f"   wall {row['wall_s_mean']:.1f} s"
        )
    print(
        f"async - sync final eval: {summary['after_async_minus_sync']:+.3f} ± "
        f"{summary['after_async_minus_sync_se']:.3f}"
        f"   wall async/sync: {summary['wall_async_over_sync']:.2f}x"
    )


def main() -> None:
    args = parse_args()
    seeds = args.seed_list
    configs = {
        (mode, seed): build_config(
            args.config,
            args.overrides,
            mode=mode,
            seed=seed,
            steps=args.steps,
            eval_episodes=args.eval_episodes,
            temperature=args.temperature,
            max_time_s=args.max_time_s,
        )
        for seed in seeds
        for mode in MODES
    }  # every config is validated before the first run starts
    load = os.getloadavg()[0]
    started = time.monotonic()
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {
        "config": args.config,
        "overrides": args.overrides,
        "steps": args.steps,
        "seeds": seeds,
        "eval_episodes_per_task": args.eval_episodes,
        "eval_temperature": args.temperature,
        "max_time_s": args.max_time_s,
        "model": configs[MODES[0], seeds[0]].model.name,
        "host": platform.node(),
        "cpu_threads": torch.get_num_threads(),
        "load_avg_1m": load,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    runs = run_all(configs, seeds, header, path)
    summary = summarise(runs)
    print(
        f"\nconfig={args.config} {' '.join(args.overrides)} steps={args.steps} seeds={seeds} "
        f"eval episodes/task={args.eval_episodes} T={args.temperature} load={load:.1f}"
    )
    print_summary(summary)
    out = {**header, "complete": True, "total_wall_s": round(time.monotonic() - started, 1), "runs": runs, **summary}
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
