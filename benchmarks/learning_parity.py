"""Does async GRPO learn as well as sync? The same config trained in both modes for the same steps, in one run.

    python benchmarks/learning_parity.py [--config configs/ci-tiny.yaml] [--steps 16] [--seeds 0,1,2]
        [--variant ppo|vanilla|tis|cispo|topr|decoupled] [--max-staleness 1]
        [--is-correction none|token|sequence|geometric]
        [--eval-episodes 64] [--temperature 1.0] [--set algorithm.lr=0.002 ...] [--warm-start DIR]
        [--out benchmarks/results/learning_parity.json]
    python benchmarks/learning_parity.py --merge A.json B.json --out C.json   # seeds run apart, one comparison

For every seed, each mode starts from the same initial weights and seed (the config's `seed` is replaced), trains
exactly `--steps` learner steps, and its final policy is evaluated on the same held-out seeds (RUN_DIR/eval.json,
"before" and "after"). Equal steps means no early stop in either mode: the config's wall-time limit is lifted and
zero-variance groups are kept (advantage 0, no gradient) instead of filtered, so a policy that collapsed onto one
reply, or solved the task, still takes its remaining steps rather than stopping as "converged" or "collapsed".

One run of one seed says little, so the comparison is over seeds and paired by seed (both modes of a seed share the
initial weights and the held-out episodes): per seed async - sync final reward, their mean and its paired standard
error, and "parity" when the mean difference is no worse than minus one paired standard error. Also: each mode's
mean final reward and its standard error over seeds, mean wall time of each mode and the speedup sync / async,
last training batch reward and mean staleness.

`--variant` and `--is-correction` apply to both modes (the same algorithm, trained sync or async);
`--max-staleness` to async only (sync is max_staleness 0 by definition).

`--temperature` is the evaluation temperature: 1.0 (default) measures the policy's expected reward, needed for
Letters-v0 whose prompt does not vary with the seed (greedy would be one sample); 0 evaluates greedily.
`--set KEY=VALUE` overrides any config field by its dotted path (the value is read as YAML).

`--warm-start DIR` compares RL alone from one SFT checkpoint: the config's `sft:` stage runs once (with the config's
own seed) and is saved to DIR as a Hugging Face model directory, then every run of every seed starts from it
(`model.name` DIR, no SFT stage of its own, so its "before" evaluation is the checkpoint's). A DIR this benchmark made
before is reused when the model, tasks and SFT settings agree (it is refused, naming the section, when they do not),
so seeds run in batches and merged with `--merge` share the checkpoint; the files record its weights' SHA-256.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import platform
import shutil
import tempfile
import time
import typing
from pathlib import Path
from typing import Any

import yaml

from envhub.errors import ConfigError
from envhub.trainer.config import AlgorithmConfig, ISCorrectionConfig, TrainConfig, config_from_dict, config_to_dict
from envhub.trainer.run.metrics import learner_stat

# torch and the trainer are imported where a run needs them: a bad command line is refused in a second, not after
# loading torch and transformers

MODES = ("sync", "async")
# the config's own choices: a variant or level the config accepts is a choice here with nothing to edit
VARIANTS = typing.get_args(typing.get_type_hints(AlgorithmConfig)["pg_variant"])
IS_LEVELS = typing.get_args(typing.get_type_hints(ISCorrectionConfig)["level"])
WARM_START_RECORD = "warm_start.json"  # what made a --warm-start directory; its presence marks one finished
WARM_START_SECTIONS = ("model", "tasks", "sft")  # the config sections that decide the checkpoint


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Set `a.b.c=value` in a nested config dict; the value is parsed as YAML (so 2e-6, true, [1, 2] work). A number
    names an item of a list: `tasks.0.kwargs.size=4` sets the first task's `size`."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r} is not KEY=VALUE", hint="e.g. --set algorithm.lr=0.002")
    *parents, leaf = key.split(".")
    node: Any = data
    for part in parents:
        child = node[_list_index(node, part, assignment)] if isinstance(node, list) else node.setdefault(part, {})
        if not isinstance(child, (dict, list)):
            raise ConfigError(
                f"--set {assignment!r}: {part!r} is not a section",
                hint="name a field inside a section, e.g. rollout.group_size",
            )
        node = child
    if isinstance(node, list):
        node[_list_index(node, leaf, assignment)] = yaml.safe_load(raw)
    else:
        node[leaf] = yaml.safe_load(raw)


def _list_index(items: list[Any], part: str, assignment: str) -> int:
    """`part` as an index of `items` (a list in the config), or a ConfigError naming the list's length."""
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(
            f"--set {assignment!r}: {part!r} is not an item of a list of {len(items)}",
            hint=f"name an item by its index, 0 to {len(items) - 1}" if items else "the list is empty",
        )
    return int(part)


def build_config(
    path: str,
    overrides: list[str],
    *,
    mode: str,
    seed: int | None,
    steps: int,
    eval_episodes: int,
    temperature: float,
    max_time_s: float = 0.0,
    variant: str | None = None,
    max_staleness: float | None = None,
    is_correction: str | None = None,
) -> TrainConfig:
    """The config file with --set overrides applied, then this run's mode, seed, steps, algorithm and evaluation.

    The config's own `budget.max_time_s` is replaced by `max_time_s` (0 = none): a wall-time limit would stop the
    slower mode after fewer steps, and the comparison is at equal steps. For the same reason zero-variance groups are
    kept (`filter_zero_variance: false`): filtering them is what stops a run early as converged or collapsed.
    `variant` and `is_correction` (None = the config's) apply to both modes, `max_staleness` to async only; `seed`
    None keeps the config's.
    """
    data = yaml.safe_load(Path(path).read_text()) or {}
    for assignment in overrides:
        apply_override(data, assignment)
    if seed is not None:
        data["seed"] = seed
    algorithm = data.setdefault("algorithm", {})
    algorithm["mode"] = mode
    algorithm["filter_zero_variance"] = False
    if variant is not None:
        algorithm["pg_variant"] = variant
    if is_correction is not None:
        correction = algorithm.setdefault("is_correction", {})
        if not isinstance(correction, dict):
            raise ConfigError("algorithm.is_correction must be a section", hint="e.g. is_correction: {level: token}")
        correction["level"] = is_correction
    if max_staleness is not None and mode == "async":
        algorithm["max_staleness"] = max_staleness
    budget = data.setdefault("budget", {})
    budget["steps"] = steps
    budget["checkpoint_every"] = steps
    budget["max_time_s"] = max_time_s
    evaluation = data.setdefault("evaluation", {})
    evaluation["episodes"] = eval_episodes
    evaluation["temperature"] = temperature
    return config_from_dict(data)


def history_mean(history: list[dict[str, Any]], key: str) -> float:
    """Mean of one per-step metric over the run: a row field, else a learner statistic (0 when none logged it)."""
    values = [row.get(key, learner_stat(row, key, None)) for row in history]
    values = [v for v in values if isinstance(v, (int, float))]
    return sum(values) / len(values) if values else 0.0


async def train_mode(config: TrainConfig, out_dir: Path) -> dict[str, Any]:
    """Train one mode and return its evaluation and timings."""
    started = time.monotonic()
    from envhub.trainer.train import Trainer

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
        "mean_staleness": history_mean(result.history, "staleness"),
        "mean_clip_fraction": history_mean(result.history, "clip_fraction"),
        "mean_kl_behavior": history_mean(result.history, "kl_behavior"),
        "batch_reward_by_step": [round(r.get("batch_reward", 0.0), 4) for r in result.history],
    }


def weights_digest(directory: Path) -> str:
    """SHA-256 over a model directory's safetensors files (name and bytes, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.safetensors")):
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def warm_start_checkpoint(config: TrainConfig, directory: Path) -> dict[str, Any]:
    """`config`'s SFT stage run once and saved to `directory`, or the checkpoint a previous run saved there.

    Returns the directory's record: the config sections it was made from, the seed, the SFT statistics and the
    weights' SHA-256. The checkpoint is written beside `directory` and renamed into place when complete, so an
    interrupted stage leaves nothing that a later run would take for a checkpoint.
    """
    made_from = json.loads(json.dumps({key: config_to_dict(config)[key] for key in WARM_START_SECTIONS}))
    record_path = directory / WARM_START_RECORD
    if record_path.exists():
        try:
            record = json.loads(record_path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--warm-start {directory}: {WARM_START_RECORD} is not JSON ({exc})") from None
        for key in WARM_START_SECTIONS:
            theirs = (record.get("made_from") or {}).get(key)
            if theirs != made_from[key]:
                raise ConfigError(
                    f"--warm-start {directory} was made with another {key}: section ({theirs!r}; this run's is"
                    f" {made_from[key]!r})",
                    hint="give a new directory for these settings, or the settings that made this one",
                )
        print(f"warm start: reusing {directory} (SFT with seed {record.get('seed')})", flush=True)
        return record
    if directory.exists() and any(directory.iterdir()):
        raise ConfigError(
            f"--warm-start {directory} exists and is not a checkpoint this benchmark made (no {WARM_START_RECORD})",
            hint="give a new or empty directory",
        )
    if not (config.sft.collect or config.sft.data):
        raise ConfigError(
            "--warm-start: the config has no SFT stage to run once (sft.collect and sft.data are unset)",
            hint="set one, e.g. --set sft.collect=32 (expert episodes per task), or drop --warm-start",
        )
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    from envhub.trainer.models import build_policy
    from envhub.trainer.sft import warm_start

    model, tokenizer = build_policy(config.model, config.seed)
    stats = asyncio.run(warm_start(model, tokenizer, config, partial))
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    record = {"made_from": made_from, "seed": config.seed, "sft": stats, "weights_sha256": weights_digest(partial)}
    (partial / WARM_START_RECORD).write_text(json.dumps(record, indent=2))
    if directory.exists():
        directory.rmdir()  # empty, checked above
    partial.rename(directory)
    print(f"warm start: saved the SFT checkpoint to {directory}", flush=True)
    return record


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Across seeds: each mode's mean final reward and wall time, and the async - sync difference paired by seed.

    `runs[mode][i]` must be the same seed for both modes. Parity: the mean paired difference is at least minus its
    standard error (async no worse than sync within one paired SE). Speedup: mean sync wall / mean async wall.
    """
    sync_seeds = [r.get("seed") for r in runs["sync"]]
    if sync_seeds != [r.get("seed") for r in runs["async"]] or not sync_seeds:
        raise ValueError(
            f"pairing needs the same seeds in both modes, got {[r.get('seed') for r in runs['async']]}"
            f" for async and {sync_seeds} for sync"
        )
    summary: dict[str, Any] = {}
    for mode in MODES:
        after, se = mean_se([r["eval_after"] for r in runs[mode]])
        wall, wall_se = mean_se([r["wall_s"] for r in runs[mode]])
        summary[mode] = {
            "eval_after_mean": after,
            "eval_after_se_over_seeds": se,
            "eval_after_by_seed": [r["eval_after"] for r in runs[mode]],
            "wall_s_mean": wall,
            "wall_s_se": wall_se,
            "steps": [r["steps"] for r in runs[mode]],
        }
    diffs = [a["eval_after"] - s["eval_after"] for s, a in zip(runs["sync"], runs["async"])]
    diff, diff_se = mean_se(diffs)
    summary["seeds"] = sync_seeds
    summary["after_async_minus_sync_by_seed"] = diffs
    summary["after_async_minus_sync"] = diff
    summary["after_async_minus_sync_se"] = diff_se
    summary["parity_within_one_se"] = diff >= -diff_se
    summary["wall_async_over_sync"] = summary["async"]["wall_s_mean"] / summary["sync"]["wall_s_mean"]
    summary["speedup_sync_over_async"] = summary["sync"]["wall_s_mean"] / summary["async"]["wall_s_mean"]
    summary["equal_steps"] = len({step for mode in MODES for step in summary[mode]["steps"]}) == 1
    summary["per_task_async_minus_sync"] = per_task_differences(runs)
    return summary


def per_task_differences(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per task: async - sync final reward by seed, its mean and paired SE (tasks every run evaluated; runs without
    per-task figures, from before they were recorded, give none)."""
    every = [r.get("per_task_after") for mode in MODES for r in runs[mode]]
    if not every or not all(isinstance(tasks, dict) for tasks in every):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for task in sorted(set.intersection(*(set(tasks) for tasks in every))):
        diffs = [a["per_task_after"][task] - s["per_task_after"][task] for s, a in zip(runs["sync"], runs["async"])]
        mean, se = mean_se(diffs)
        out[task] = {"by_seed": diffs, "mean": mean, "se": se}
    return out


# what must agree for two result files to be one comparison: the runs differ only in their seeds
SETTINGS = (
    "config",
    "overrides",
    "steps",
    "eval_episodes_per_task",
    "eval_temperature",
    "max_time_s",
    "pg_variant",
    "is_correction",
    "warm_start_weights_sha256",
    "async_max_staleness",
    "model",
)


def merge_results(reports: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One comparison from result files of the same settings over different seeds (e.g. seeds 0-2 and 3-5 run apart).

    A seed counts when both of its modes finished (an interrupted file keeps its finished pairs). Files whose
    settings differ, or that share a seed, are refused with the field or seed named.
    """
    if not reports:
        raise ConfigError("--merge needs at least one result file")
    first_name, first = reports[0]
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    seen: dict[int, str] = {}
    for name, report in reports:
        for key in SETTINGS:
            if report.get(key) != first.get(key):
                raise ConfigError(
                    f"{name} and {first_name} differ in {key}: {report.get(key)!r} vs {first.get(key)!r}",
                    hint="merge only runs of the same settings; they may differ in their seeds",
                )
        by_mode = report.get("runs") or {}
        pairs = list(zip(by_mode.get("sync", []), by_mode.get("async", [])))
        for sync, async_ in pairs:
            seed = sync.get("seed")
            if seed != async_.get("seed"):
                raise ConfigError(
                    f"{name}: its sync and async runs are not paired by seed ({seed} vs {async_.get('seed')})"
                )
            if seed in seen:
                raise ConfigError(f"seed {seed} is in both {seen[seed]} and {name}", hint="a seed may be counted once")
            seen[seed] = name
            runs["sync"].append(sync)
            runs["async"].append(async_)
    if not seen:
        raise ConfigError("no seed in these files finished both modes", hint="run the benchmark to the end of a seed")
    header = {key: first.get(key) for key in SETTINGS}
    header["seeds"] = sorted(seen)
    header["merged_from"] = [name for name, _ in reports]
    order = sorted(range(len(runs["sync"])), key=lambda i: runs["sync"][i]["seed"])
    runs = {mode: [runs[mode][i] for i in order] for mode in MODES}
    return {**header, "complete": True, "runs": runs, **summarise(runs)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (`argv`, or sys.argv's), with the seeds parsed into `args.seed_list`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/ci-tiny.yaml")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds, e.g. 0,1,2")
    parser.add_argument("--variant", choices=VARIANTS, help="algorithm.pg_variant for both modes (default: config's)")
    parser.add_argument(
        "--max-staleness",
        type=float,
        help="algorithm.max_staleness of the async runs, in steps; 0.5 = half a step's groups (default: the config's)",
    )
    parser.add_argument(
        "--is-correction", choices=IS_LEVELS, help="algorithm.is_correction.level for both modes (default: config's)"
    )
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
    parser.add_argument(
        "--warm-start",
        metavar="DIR",
        help="run the config's SFT stage once into DIR (or reuse it) and start every run from that checkpoint",
    )
    parser.add_argument("--out", default="benchmarks/results/learning_parity.json")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULT_JSON",
        help="train nothing: combine result files of the same settings over different seeds into --out",
    )
    args = parser.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2")
    if not args.seed_list:
        parser.error("--seeds: give at least one seed")
    if len(set(args.seed_list)) != len(args.seed_list):
        parser.error(f"--seeds {args.seeds!r}: a seed is repeated; pairing needs distinct seeds")
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: give at least 1 learner step")
    if args.max_staleness is not None and args.max_staleness < 0:
        parser.error(f"--max-staleness {args.max_staleness:g}: give 0 or more steps")
    if args.eval_episodes < 1:
        parser.error(f"--eval-episodes {args.eval_episodes}: give at least 1 held-out episode per task")
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
                    f"  staleness {run['mean_staleness']:.2f}  clipped {run['mean_clip_fraction']:.2f}",
                    flush=True,
                )
    return runs


def print_summary(summary: dict[str, Any]) -> None:
    """Each mode's final evaluation and wall time, and the paired difference with its verdict."""
    for mode in MODES:
        row = summary[mode]
        by_seed = ", ".join(f"{v:.3f}" for v in row["eval_after_by_seed"])
        print(
            f"{mode:<6} final eval {row['eval_after_mean']:.3f} ± {row['eval_after_se_over_seeds']:.3f} (se over seeds;"
            f" {by_seed})   wall {row['wall_s_mean']:.1f} s   steps {row['steps']}"
        )
    for task, row in summary.get("per_task_async_minus_sync", {}).items():
        by_seed = ", ".join(f"{v:+.3f}" for v in row["by_seed"])
        print(f"  {task:<24} async - sync {row['mean']:+.3f} ± {row['se']:.3f} ({by_seed})")
    verdict = "parity (within one paired SE)" if summary["parity_within_one_se"] else "async worse by > one paired SE"
    print(
        f"async - sync final eval, paired: {summary['after_async_minus_sync']:+.3f} ± "
        f"{summary['after_async_minus_sync_se']:.3f}: {verdict}"
        f"   wall sync {summary['sync']['wall_s_mean']:.1f} s, async {summary['async']['wall_s_mean']:.1f} s"
        f" (speedup {summary['speedup_sync_over_async']:.2f}x)"
    )


def merge_files(paths: list[str], out: Path) -> None:
    """`--merge`: read the result files, combine them, print the summary and write `out`."""
    reports = []
    for name in paths:
        try:
            report = json.loads(Path(name).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"--merge {name}: cannot read it as a result file ({exc})") from exc
        if not isinstance(report, dict) or not isinstance(report.get("runs"), dict):
            raise ConfigError(f"--merge {name}: not a learning_parity result (no 'runs' by mode)")
        reports.append((name, report))
    merged = merge_results(reports)
    print(f"merged seeds {merged['seeds']} from {', '.join(paths)}")
    print_summary(merged)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2))
    print(f"wrote {out}")


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpu_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge:
        try:
            merge_files(args.merge, Path(args.out))
        except ConfigError as exc:
            raise SystemExit(f"learning_parity: {exc}") from None
        return
    seeds = args.seed_list

    def every_config(overrides: list[str]) -> dict[tuple[str, int], TrainConfig]:
        return {
            (mode, seed): build_config(
                args.config,
                overrides,
                mode=mode,
                seed=seed,
                steps=args.steps,
                eval_episodes=args.eval_episodes,
                temperature=args.temperature,
                max_time_s=args.max_time_s,
                variant=args.variant,
                max_staleness=args.max_staleness,
                is_correction=args.is_correction,
            )
            for seed in seeds
            for mode in MODES
        }

    configs = every_config(args.overrides)  # every config is validated before the first run (or SFT stage) starts
    warm: dict[str, Any] = {}
    if args.warm_start:
        directory = Path(args.warm_start).expanduser().resolve()
        try:
            base = build_config(  # the config's own seed: the checkpoint is not one of the compared seeds'
                args.config, args.overrides, mode="sync", seed=None, steps=args.steps, eval_episodes=1, temperature=0
            )
            record = warm_start_checkpoint(base, directory)
        except ConfigError as exc:
            raise SystemExit(f"learning_parity: {exc}") from None
        warm = {"warm_start": {"dir": str(directory), **record}, "warm_start_weights_sha256": record["weights_sha256"]}
        # RL from the checkpoint: no SFT stage of its own, so each run's "before" evaluation is the checkpoint's
        configs = every_config(
            [*args.overrides, f"model.name={directory}", "sft.collect=0", "sft.data=''", "evaluation.after_sft=false"]
        )
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
        "pg_variant": configs[MODES[0], seeds[0]].algorithm.pg_variant,
        "is_correction": configs[MODES[0], seeds[0]].algorithm.is_correction.level,
        "async_max_staleness": configs["async", seeds[0]].algorithm.max_staleness,
        "model": configs[MODES[0], seeds[0]].model.name,
        "host": platform.node(),
        "load_avg_1m": load,
        **machine(),  # torch only now: every refusal above came first
        **warm,
    }
    runs = run_all(configs, seeds, header, path)
    summary = summarise(runs)
    print(
        f"\nconfig={args.config} {' '.join(args.overrides)} steps={args.steps} seeds={seeds} "
        f"variant={header['pg_variant']} is_correction={header['is_correction']} "
        f"async max_staleness={header['async_max_staleness']:g} "
        f"eval episodes/task={args.eval_episodes} T={args.temperature} load={load:.1f}"
    )
    print_summary(summary)
    out = {**header, "complete": True, "total_wall_s": round(time.monotonic() - started, 1), "runs": runs, **summary}
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
