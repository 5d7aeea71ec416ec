"""`envhub train CONFIG [--resume | --overwrite] [--out DIR] [--ray local|ADDRESS]`, `envhub bench async` and
`envhub bench all --out DIR`.

On a terminal a progress bar follows the run; elsewhere (a log file, CI) each step is one plain line instead, so a
log holds no carriage-return redraws."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from envhub.cli.imports import add_import_option


def _cmd_train(args: argparse.Namespace) -> int:

    from envhub.trainer.config import load_config
    from envhub.trainer.train import Trainer
    from envhub.user_modules import resolve_target

    config = load_config(args.config)
    # after the config's own imports, so that Ray workers import the same list the driver did
    config.imports += [t for t in map(resolve_target, args.imports or []) if t not in config.imports]
    if args.steps is not None:
        config.budget.steps = args.steps
    if args.dry_run:
        return _dry_run(config, args)
    _refuse_dry_run_flags(args)
    _refuse_an_impossible_placement(config, args)
    ray = None
    if args.ray:
        from envhub.errors import ConfigError
        from envhub.trainer.rollout.ray_workers import RayOptions

        try:
            resources = json.loads(args.ray_resources) if args.ray_resources else {}
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"--ray-resources is not JSON: {exc}", hint='e.g. --ray-resources \'{"env_host": 1}\''
            ) from None
        ray = RayOptions(address=args.ray, workers=args.ray_workers, resources=resources)
    bar, on_step = _step_progress(config.budget.steps)
    trainer = Trainer(config, out_dir=args.out, on_step=on_step, ray=ray)
    trainer.on_progress = lambda p: bar.set_description_str(
        f"train [episodes {p['episodes_running'] or 0} running {p['episodes_done']} done | groups "
        f"{p['groups_accepted']} ok "
        f"{p['groups_filtered']} filtered {p['groups_dropped']} dropped | {p['tokens_per_s']:.1f} tok/s]",
        refresh=True,
    )

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, trainer.request_stop)
        return await trainer.run(resume=args.resume, overwrite=args.overwrite)

    try:
        result = asyncio.run(main())
    except BaseException:
        bar.leave = False  # the error gets its own clean line
        bar.close()
        raise
    bar.n = result.last_step
    bar.close()
    written = [
        f"{name} {path}"
        for name, path in (
            ("checkpoint", result.checkpoint),
            ("metrics", result.out_dir / "metrics.jsonl"),
            ("curve", result.out_dir / "reward_curve.png"),
        )
        if path is not None and path.exists()
    ]
    print(
        f"stopped: {result.stop_reason}; steps {result.first_step}->{result.last_step} in {result.wall_s:.1f}s; "
        + ("; ".join(written) if result.last_step > result.first_step else "no step finished, nothing saved")
    )
    _print_where_time_went(trainer, result)
    if result.interrupted:
        print(
            "interrupted: resume with --resume" if result.checkpoint else "interrupted before the first step",
            file=sys.stderr,
        )
        return 130
    return 0


def _refuse_dry_run_flags(args: argparse.Namespace) -> None:
    """ConfigError for --json / --gpus / --gpu-memory-gib / --host-memory-gib given to a real run."""
    from envhub.errors import ConfigError

    for name in ("json", "gpus", "gpu_memory_gib", "host_memory_gib"):
        if getattr(args, name) not in (None, False):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} describes a dry run", hint=f"envhub train --dry-run CONFIG {flag} ...")


def _refuse_an_impossible_placement(config: Any, args: argparse.Namespace) -> None:
    """Before a run on GPUs, the dry run's placement on this machine (its own GPUs, not a `machine:` section that
    describes another): a run it refuses stops here, each refusal naming its number and fix, before a model loads.
    CPU runs are not checked (their memory is the host's, and the learner's arithmetic is for GPU allocators)."""
    from envhub.errors import ConfigError
    from envhub.trainer.placement.machine import machine_for
    from envhub.trainer.placement.placement import plan_placement

    if config.model.device == "cpu":
        return
    machine = machine_for()
    if machine.gpus == 0 and config.model.device != "cuda":
        return
    placement = plan_placement(config, machine, ray=args.ray, ray_workers=args.ray_workers)
    if placement.refusals:
        raise ConfigError(
            "this machine cannot run the config as placed: " + "; ".join(placement.refusals),
            hint=f"envhub train --dry-run {args.config} shows where each process goes and the memory it needs",
        )


def _dry_run(config: Any, args: argparse.Namespace) -> int:
    """Validate `config` and print where each process runs and the memory it needs; start nothing. Exit 1 when
    the placement refuses the run (each refusal names the number and the fix)."""
    from envhub.trainer.placement.machine import machine_for
    from envhub.trainer.placement.placement import plan_placement
    from envhub.trainer.placement.report import placement_text
    from envhub.user_modules import load_user_modules

    load_user_modules(config.imports)  # a kind from the user's module is known before it is asked where it runs
    config.check_engine()
    machine = machine_for(args.gpus, args.gpu_memory_gib, args.host_memory_gib, stated=config.machine)
    placement = plan_placement(config, machine, ray=args.ray, ray_workers=args.ray_workers)
    if args.json:
        print(json.dumps(placement.to_dict(), indent=2))
    else:
        print(placement_text(placement))
    return 1 if placement.refusals else 0


def _step_progress(total: int) -> tuple[Any, Any]:
    """A progress bar on a terminal; elsewhere (a log file, CI) one plain line a step, with no carriage returns.
    Returns the bar (disabled off a terminal) and the trainer's on_step callback."""
    from tqdm import tqdm

    terminal = sys.stderr.isatty()
    bar = tqdm(total=total, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True, disable=not terminal)

    def on_step(row: dict[str, Any]) -> None:
        reward = row["reward"].get("all")
        postfix = {
            "reward": "-" if reward is None else f"{reward:.3f}",
            "loss": f"{row['learner']['loss']:.4f}",
            "stale": f"{row['staleness']:.1f}",
        }
        if not terminal:
            fields = " ".join(f"{k} {v}" for k, v in postfix.items())
            print(f"step {row['step']}/{total} {fields} ({row['step_s']:.1f}s)", file=sys.stderr, flush=True)
        bar.set_postfix(**postfix)
        bar.update(1)

    return bar, on_step


def _print_where_time_went(trainer: Any, result: Any) -> None:
    """The run's stages and a mean RL step; a line on stderr when its time budget fitted under half its steps, and one
    when training episodes timed out."""
    from envhub.trainer.run.stages import timeouts_line

    print(trainer.clock.summary())
    budget = trainer.config.budget
    short = trainer.clock.shortfall(budget.steps, budget.max_time_s, budget.max_run_s)
    if result.stop_reason == "time budget spent" and short:
        print(short, file=sys.stderr)
    timed_out = timeouts_line(result.history[-1] if result.history else None, trainer.config.rollout.episode_timeout_s)
    if timed_out:
        print(timed_out, file=sys.stderr)


def _cmd_bench_async(args: argparse.Namespace) -> int:
    from envhub.trainer.bench import main as bench_main

    return bench_main(out=args.out, steps=args.steps, workload=args.workload, keep_runs=args.keep_runs)


def _cmd_bench_all(args: argparse.Namespace) -> int:
    import importlib.util
    from pathlib import Path

    import envhub
    from envhub.errors import EnvhubError

    script = Path(envhub.__file__).resolve().parents[1] / "benchmarks" / "report.py"
    if not script.exists():
        raise EnvhubError(
            "envhub bench all runs benchmarks/report.py from a source checkout",
            hint="pip install -e . from the repository",
        )
    spec = importlib.util.spec_from_file_location("envhub_bench_report", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(out=args.out, quick=args.quick)


def add_commands(sub: Any) -> None:
    """Register `train`, `bench async` and `bench all` on the envhub CLI."""
    p = sub.add_parser("train", help="train a policy with async GRPO from a YAML config")
    p.add_argument("config", help="YAML config, e.g. configs/ci-tiny.yaml")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the output dir")
    p.add_argument(
        "--overwrite", action="store_true", help="delete the run already in the output dir and start a new one"
    )
    p.add_argument("--out", default=None, help="output directory (default: out_dir from the config)")
    p.add_argument("--steps", type=int, default=None, help="override budget.steps")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config and print where each process runs and the memory it needs; start nothing",
    )
    p.add_argument("--json", action="store_true", help="with --dry-run: print the placement as JSON")
    p.add_argument(
        "--gpus", type=int, default=None, help="with --dry-run: GPUs of the target machine (default: this one's)"
    )
    p.add_argument(
        "--gpu-memory-gib", type=float, default=None, help="with --dry-run: memory of each GPU (e.g. 80 for an H100)"
    )
    p.add_argument(
        "--host-memory-gib", type=float, default=None, help="with --dry-run: host memory (default: this machine's)"
    )
    add_import_option(p)
    p.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="play episodes on Ray EnvWorker actors: 'local' or a cluster address (needs envhub[ray])",
    )
    p.add_argument("--ray-workers", type=int, default=2, help="EnvWorker actors with --ray")
    p.add_argument(
        "--ray-resources",
        default="",
        metavar="JSON",
        help='custom Ray resources per worker, e.g. \'{"env_host": 1}\' to place workers on CPU hosts',
    )
    p.set_defaults(handler=_cmd_train)
    if "bench" in sub.choices:  # another subsystem owns `bench`; ours stay reachable as `bench-async` / `bench-all`
        p = sub.add_parser("bench-async", help="async vs sync GRPO training throughput")
        p_all = sub.add_parser("bench-all", help="end-to-end benchmark report")
    else:
        bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", metavar="BENCH")
        p = bench.add_parser("async", help="async vs sync GRPO training throughput")
        p_all = bench.add_parser(
            "all", help="end-to-end report: env steps/s, sandboxes, engine, async vs sync, Ray env workers"
        )
    p.add_argument("--out", default="async_vs_sync.json", help="where to write the JSON result")
    p.add_argument("--steps", type=int, default=6, help="learner steps per mode")
    p.add_argument(
        "--workload",
        choices=("latency", "sandbox", "sandbox-pinned"),
        default="latency",
        help="latency: an env with heavy-tailed waits; sandbox: a bash tool env in Docker sandboxes; "
        "sandbox-pinned: the same with the trainer on CPU 0 and the sandboxes on CPU 1",
    )
    p.add_argument(
        "--keep-runs", default=None, metavar="DIR", help="keep each mode's run directory (DIR/sync, DIR/async)"
    )
    p.set_defaults(handler=_cmd_bench_async)
    p_all.add_argument("--out", default="bench-report", help="directory for report.md and report.json")
    p_all.add_argument("--quick", action="store_true", help="fewer samples and steps (a few minutes on a small CPU)")
    p_all.set_defaults(handler=_cmd_bench_all)
