"""`envhub swe grade|validate|build`: SWE-bench-compatible grading and task checks from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def add_commands(sub: Any) -> None:
    """Add the `swe` command group to the envhub CLI."""
    swe = sub.add_parser("swe", help="SWE-bench tasks: grade predictions, validate task files")
    commands = swe.add_subparsers(dest="swe_command", metavar="SUBCOMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--tasks", default=None, help="JSONL of SWE-bench instances (default: the bundled set)")
        p.add_argument("--repos-dir", default=None, help="directory of owner__name git repositories (default: bundled repos)")
        p.add_argument("--backend", default="docker", choices=("docker", "bwrap", "local"), help="sandbox backend (default docker)")
        p.add_argument("--workers", type=int, default=4, help="instances graded in parallel (default 4)")
        p.add_argument("--timeout", type=float, default=300, help="seconds allowed for one test run (default 300)")
        p.add_argument("--instance-ids", nargs="*", default=None, help="only these instances")

    p = commands.add_parser("grade", help="grade a SWE-bench predictions file (instance_id, model_patch, model_name_or_path)")
    common(p)
    p.add_argument("--predictions", required=True, help="predictions JSONL (or JSON list)")
    p.add_argument("--out", default=None, help="write the JSON report here (default: print it)")
    p.set_defaults(handler=_cmd_grade)
    p = commands.add_parser("validate", help="check every instance: repo, base_commit, patches, FAIL_TO_PASS fails before / passes after")
    common(p)
    p.set_defaults(handler=_cmd_validate)
    p = commands.add_parser("build", help="build the bundled repositories and print their directory")
    p.add_argument("--write-jsonl", default=None, help="also write the bundled instances to this JSONL file")
    p.set_defaults(handler=_cmd_build)


def _load(args: argparse.Namespace) -> tuple[list, Path]:
    from envhub.envs.swe.env import resolve_tasks

    instances, repos_dir = resolve_tasks(args.tasks, args.repos_dir)
    if args.instance_ids:
        wanted = set(args.instance_ids)
        instances = [i for i in instances if i.instance_id in wanted]
    return instances, repos_dir


def _load_predictions(path: str) -> list:
    from envhub.envs.swe.validate import Prediction
    from envhub.errors import ConfigError

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"predictions file {path} does not exist")
    text = file.read_text(encoding="utf-8")
    try:
        rows = json.loads(text) if text.lstrip().startswith("[") else [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    predictions = []
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict) or "instance_id" not in row:
            raise ConfigError(f"{path}: prediction {number} has no instance_id", hint="each line needs instance_id, model_patch, model_name_or_path")
        predictions.append(Prediction(str(row["instance_id"]), row.get("model_patch") or "", str(row.get("model_name_or_path") or "")))
    return predictions


def _run(coro_factory: Any, args: argparse.Namespace) -> Any:
    import asyncio

    from envhub.sandboxes import SandboxPool

    async def main() -> Any:
        async with SandboxPool(backend=args.backend, size=min(args.workers, 4), max_size=2 * args.workers) as pool:
            return await coro_factory(pool)

    return asyncio.run(main())


def _cmd_grade(args: argparse.Namespace) -> int:
    from envhub.envs.swe.validate import grade_predictions

    instances, repos_dir = _load(args)
    predictions = _load_predictions(args.predictions)
    started = time.perf_counter()
    report = _run(lambda pool: grade_predictions(instances, predictions, pool, repos_dir, concurrency=args.workers, test_timeout=args.timeout), args)
    report["seconds"] = round(time.perf_counter() - started, 2)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    print(f"resolved {report['resolved_instances']}/{report['submitted_instances']}, unresolved {report['unresolved_instances']}, "
          f"errors {report['error_instances']} in {report['seconds']} s" + (f"; report: {args.out}" if args.out else ""), file=sys.stderr)
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from envhub.envs.swe.validate import validate_all

    instances, repos_dir = _load(args)
    started = time.perf_counter()
    problems = _run(lambda pool: validate_all(instances, pool, repos_dir, concurrency=args.workers, test_timeout=args.timeout), args)
    for problem in problems:
        print(problem)
    bad = len({p.instance_id for p in problems})
    print(f"{len(instances) - bad}/{len(instances)} instances valid ({time.perf_counter() - started:.1f} s)", file=sys.stderr)
    return 1 if problems else 0


def _cmd_build(args: argparse.Namespace) -> int:
    from envhub.envs.swe.repos import build_bundled_repos, bundled_instances
    from envhub.envs.swe.tasks import write_instances

    repos_dir = build_bundled_repos()
    if args.write_jsonl:
        write_instances(bundled_instances(repos_dir), args.write_jsonl)
    print(repos_dir)
    return 0
