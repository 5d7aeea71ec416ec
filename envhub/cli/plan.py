"""`envhub plan RUN_DIR [--engines N] [--env-hosts M] [--learners L] [--mode sync|async] [--max-staleness S]
[--redundancy R] [--sweep] --out FILE`: predict a training pipeline's throughput from a recorded run.

Reads the run's stage times (envhub.trainer.plan.record), fits how each stage slows with what runs beside it
(plan.model), simulates the pipeline with the resources and settings asked for (plan.simulate) and prints a short
table; `--out` writes the JSON (the record, its replay, the prediction, the bounds, and with `--sweep` the scaling,
staleness and redundancy sweeps). Settings not given keep the recorded run's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from envhub.errors import EnvhubError


def _cmd_plan(args: argparse.Namespace) -> int:
    from envhub.trainer.plan.model import fit_model
    from envhub.trainer.plan.record import read_run
    from envhub.trainer.plan.report import plan_report, record_config, table

    if args.trials < 1:
        raise EnvhubError(f"--trials must be at least 1, got {args.trials}")
    record = read_run(args.run_dir)
    model = fit_model(record, args.shared)
    config = record_config(
        record,
        mode=args.mode,
        engines=args.engines,
        env_hosts=args.env_hosts,
        learners=args.learners,
        max_staleness=args.max_staleness,
        redundancy=args.redundancy,
        steps=args.steps,
        groups_per_step=args.groups_per_step,
        concurrent_groups=args.concurrent_groups,
        env_slots=args.env_slots,
        seed=args.seed,
    )
    config.validate()
    report = plan_report(record, model, config, args.trials)
    print(table(report))
    if args.sweep:
        from envhub.trainer.plan.sweeps import all_sweeps, sweep_tables

        report["sweeps"] = all_sweeps(model, config, max(args.trials // 2, 3))
        print(sweep_tables(report["sweeps"]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


def add_commands(sub: Any) -> None:
    """Register `plan` on the envhub CLI."""
    p = sub.add_parser("plan", help="predict async/sync throughput at other scales from a recorded training run")
    p.add_argument("run_dir", help="a training run's output directory (config.json, metrics.jsonl, episodes.jsonl)")
    p.add_argument("--mode", choices=("sync", "async"), default=None, help="default: the recorded run's")
    p.add_argument("--engines", type=int, default=None, help="inference engines (default 1)")
    p.add_argument("--env-hosts", type=int, default=None, help="env hosts (default 1)")
    p.add_argument("--env-slots", type=int, default=None, help="episodes one env host runs at once (0 = no limit)")
    p.add_argument("--learners", type=int, default=None, help="data-parallel learner workers (default 1)")
    p.add_argument(
        "--max-staleness", type=float, default=None, help="async staleness bound in steps (default: the run's)"
    )
    p.add_argument("--redundancy", type=int, default=None, help="extra episodes per group (default: the run's)")
    p.add_argument("--groups-per-step", type=int, default=None, help="groups per learner step (default: the run's)")
    p.add_argument("--concurrent-groups", type=int, default=None, help="groups in flight (default: the run's)")
    p.add_argument("--steps", type=int, default=None, help="learner steps to simulate (default: the run's)")
    p.add_argument(
        "--shared",
        choices=("none", "engine-learner", "all"),
        default=None,
        help="which stages share a device: all (one machine, the default for a run with the embedded engine), "
        "engine-learner, or none (a cluster)",
    )
    p.add_argument("--trials", type=int, default=5, help="simulations averaged per prediction")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="also sweep engines x env hosts, staleness and redundancy")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.set_defaults(handler=_cmd_plan)
