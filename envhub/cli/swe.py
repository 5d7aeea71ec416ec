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
        p.add_argument(
            "--tasks",
            default=None,
            help="JSONL / JSON / parquet file or hub name (e.g. princeton-nlp/SWE-bench_Verified); default: the "
            "bundled set",
        )
        p.add_argument(
            "--repos-dir", default=None, help="directory of owner__name git repositories (default: bundled repos)"
        )
        p.add_argument(
            "--dataset",
            default=None,
            choices=("swebench", "swegym", "r2egym", "swesmith"),
            help="the file's format (default: detected)",
        )
        p.add_argument(
            "--backend", default="docker", choices=("docker", "bwrap", "local"), help="sandbox backend (default docker)"
        )
        p.add_argument("--workers", type=int, default=4, help="instances graded in parallel (default 4)")
        p.add_argument("--timeout", type=float, default=300, help="seconds allowed for one test run (default 300)")
        p.add_argument("--instance-ids", nargs="*", default=None, help="only these instances")

    p = commands.add_parser(
        "grade", help="grade a SWE-bench predictions file (instance_id, model_patch, model_name_or_path)"
    )
    common(p)
    p.add_argument("--predictions", required=True, help="predictions JSONL (or JSON list)")
    p.add_argument("--out", default=None, help="write the JSON report here (default: print it)")
    p.set_defaults(handler=_cmd_grade)
    p = commands.add_parser(
        "validate", help="check every instance: repo, base_commit, patches, FAIL_TO_PASS fails before / passes after"
    )
    common(p)
    p.set_defaults(handler=_cmd_validate)
    p = commands.add_parser(
        "prepare",
        help="make every instance's image available: present, pulled, or built locally; report what is missing",
    )
    p.add_argument("--tasks", required=True, help="JSONL / JSON / parquet file or hub name")
    p.add_argument("--instance-ids", nargs="*", default=None, help="only these instances")
    p.add_argument(
        "--dataset",
        default=None,
        choices=("swebench", "swegym", "r2egym", "swesmith"),
        help="the file's format (default: detected)",
    )
    p.add_argument("--no-pull", action="store_true", help="never contact a registry")
    p.add_argument(
        "--build",
        action="store_true",
        help="build missing images locally from --repos-dir (laid out as the published ones)",
    )
    p.add_argument("--repos-dir", default=None, help="owner__name git repositories to build images from")
    p.set_defaults(handler=_cmd_prepare)
    p = commands.add_parser("build", help="build the bundled repositories and print their directory")
    p.add_argument("--write-jsonl", default=None, help="also write the bundled instances to this JSONL file")
    p.set_defaults(handler=_cmd_build)


def _load(args: argparse.Namespace) -> tuple[list, Path]:
    from envhub.envs.swe.env import resolve_tasks

    if args.dataset and args.tasks:
        from envhub.envs.swe.datasets import load_tasks

        instances, repos_dir = (
            load_tasks(args.tasks, dataset=args.dataset, with_images=args.repos_dir is None),
            args.repos_dir,
        )
    else:
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
        rows = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    predictions = []
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict) or "instance_id" not in row:
            raise ConfigError(
                f"{path}: prediction {number} has no instance_id",
                hint="each line needs instance_id, model_patch, model_name_or_path",
            )
        predictions.append(
            Prediction(str(row["instance_id"]), row.get("model_patch") or "", str(row.get("model_name_or_path") or ""))
        )
    return predictions


def _run(coro_factory: Any, args: argparse.Namespace) -> Any:
    import asyncio

    from envhub.sandboxes.multipool import MultiImagePool

    async def main() -> Any:
        async with MultiImagePool(
            args.backend, spares_budget=min(args.workers, 4), max_in_use=2 * args.workers
        ) as pool:
            return await coro_factory(pool)

    return asyncio.run(main())


def _cmd_grade(args: argparse.Namespace) -> int:
    from envhub.envs.swe.validate import grade_predictions

    instances, repos_dir = _load(args)
    predictions = _load_predictions(args.predictions)
    started = time.perf_counter()
    report = _run(
        lambda pool: grade_predictions(
            instances, predictions, pool, repos_dir, concurrency=args.workers, test_timeout=args.timeout
        ),
        args,
    )
    report["seconds"] = round(time.perf_counter() - started, 2)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    print(
        f"resolved {report['resolved_instances']}/{report['submitted_instances']}, unresolved "
        f"{report['unresolved_instances']}, "
        f"errors {report['error_instances']} in {report['seconds']} s" + (f"; report: {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from envhub.envs.swe.validate import validate_all

    instances, repos_dir = _load(args)
    started = time.perf_counter()
    problems = _run(
        lambda pool: validate_all(instances, pool, repos_dir, concurrency=args.workers, test_timeout=args.timeout), args
    )
    for problem in problems:
        print(problem)
    bad = len({p.instance_id for p in problems})
    print(
        f"{len(instances) - bad}/{len(instances)} instances valid ({time.perf_counter() - started:.1f} s)",
        file=sys.stderr,
    )
    return 1 if problems else 0


def _cmd_build(args: argparse.Namespace) -> int:
    from envhub.envs.swe.repos import build_bundled_repos, bundled_instances
    from envhub.envs.swe.tasks import write_instances

    repos_dir = build_bundled_repos()
    if args.write_jsonl:
        write_instances(bundled_instances(repos_dir), args.write_jsonl)
    print(repos_dir)
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from envhub.envs.swe.datasets import load_tasks
    from envhub.envs.swe.local_images import build_instance_image
    from envhub.errors import EnvhubError
    from envhub.sandboxes.images import ensure_image

    instances = [
        i
        for i in load_tasks(args.tasks, dataset=args.dataset)
        if not args.instance_ids or i.instance_id in set(args.instance_ids)
    ]
    images: dict[str, Any] = {}
    for instance in instances:
        if instance.image:
            images.setdefault(instance.image, instance)
    started, missing, counts = time.perf_counter(), [], {"present": 0, "pulled": 0, "built": 0}
    for image, instance in images.items():
        try:
            if args.build and args.repos_dir:
                _, built = build_instance_image(instance, args.repos_dir)
                counts["built" if built else "present"] += 1
            else:
                counts["pulled" if ensure_image(image, pull=not args.no_pull) else "present"] += 1
        except EnvhubError as exc:
            missing.append(image)
            print(f"missing  {image}: {exc.args[0]}", file=sys.stderr)
    without = len(instances) - sum(1 for i in instances if i.image)
    print(
        f"{len(instances)} instances, {len(images)} images: {counts['present']} present, {counts['pulled']} pulled, "
        f"{counts['built']} built, "
        f"{len(missing)} missing; {without} instances use the base image ({time.perf_counter() - started:.1f} s)",
        file=sys.stderr,
    )
    if missing:
        from envhub.sandboxes.images import missing_image_hint

        print("to fix: " + missing_image_hint(missing[0]).replace(missing[0], "IMAGE"), file=sys.stderr)
    return 1 if missing else 0
