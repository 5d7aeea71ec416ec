"""`envhub eval ENV [ENV...] --agent SPEC -n N -k K --concurrency C --out DIR`: evaluate an agent (see envhub.eval)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from envhub.cli import harness_eval
from envhub.cli.imports import add_import_option


class EpisodeWatch:
    """What `envhub eval` tells as episodes end: the first error of each kind on each env with its message, the
    moment it happens (the rest are counted in the table's errors column and kept in episodes.jsonl), and at the end
    how many episodes each limit cut."""

    def __init__(self) -> None:
        self.seen_errors: set[tuple[str, str]] = set()  # (env, error kind) already shown
        self.cut = {"max_turns": 0, "timeout": 0}

    def on_episode(self, record: Any) -> None:
        if record.finish in self.cut:
            self.cut[record.finish] += 1
        key = (record.env_id, record.error_kind or "")
        if record.error_kind and key not in self.seen_errors:
            self.seen_errors.add(key)
            line = f"{record.env_id} seed {record.seed}: {record.error_kind}: {record.error}"
            print(f"envhub: {line[:600]}", file=sys.stderr, flush=True)

    def report_cuts(self, max_turns: int, timeout_s: float) -> None:
        limits = {
            "max_turns": f"the {max_turns}-turn limit (--max-turns)",
            "timeout": f"the {timeout_s:g} s limit (--episode-timeout)",
        }
        parts = [f"{n} at {limits[kind]}" for kind, n in self.cut.items() if n]
        if parts:
            print(
                f"envhub: episodes cut short: {', '.join(parts)}; raise the limit to let them finish", file=sys.stderr
            )


def _cmd_eval(args: argparse.Namespace) -> int:
    if args.harness:
        from envhub.cli.harness_eval import cmd_harness_eval

        return cmd_harness_eval(args)
    from envhub.cli.agent_spec import make_agent_factory
    from envhub.errors import ConfigError
    from envhub.eval import EvalConfig, evaluate

    try:
        env_kwargs = json.loads(args.kwargs) if args.kwargs else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--kwargs is not JSON: {exc}", hint='e.g. --kwargs \'{"backend": "bwrap"}\'') from None
    options = {
        "api_key": args.api_key,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "tool_mode": args.tool_mode,
    }
    factory = make_agent_factory(args.agent, **options)
    opponent: Any = args.opponent
    opponent_factory = None
    if opponent not in ("random", "expert", "scripted"):
        opponent = opponent_factory = make_agent_factory(args.opponent, **options)
    config = EvalConfig(
        max_turns=args.max_turns,
        episode_timeout_s=args.episode_timeout,
        success_threshold=args.success_threshold,
        opponent=opponent,
        seats=tuple(args.seats),
        env_kwargs=env_kwargs,
    )
    ks = sorted({int(x) for part in (args.k or ["1"]) for x in str(part).split(",") if x})
    watch = EpisodeWatch()

    async def run() -> dict[str, Any]:
        try:
            return await evaluate(
                args.envs,
                factory,
                episodes=args.n,
                seeds=args.seed,
                concurrency=args.concurrency,
                out_dir=args.out,
                k=ks,
                samples=args.samples,
                config=config,
                agent_name=args.agent,
                progress=not args.quiet,
                on_episode=watch.on_episode,
            )
        finally:
            await factory.aclose()
            if opponent_factory is not None:
                await opponent_factory.aclose()

    summary = asyncio.run(run())
    print_table(
        summary, ks, title=f"{args.agent} ({args.n} tasks x {args.samples or max(ks)} attempts, seed {args.seed})"
    )
    if args.out:
        print(f"wrote {args.out}/summary.json and {args.out}/episodes.jsonl")
    watch.report_cuts(args.max_turns, args.episode_timeout)
    failed = sum(n for row in summary.values() for kind, n in row["errors"].items() if kind != "malformed_tool_call")
    if failed:
        print(
            f"envhub: {failed} episode(s) ended in an error (errors column); re-running the same command retries them",
            file=sys.stderr,
        )
    return 1 if failed and not any(row["episodes"] for row in summary.values()) else 0


def print_table(summary: dict[str, dict[str, Any]], ks: list[int], title: str = "") -> None:
    """The summary as a terminal table: one row per env (per seat for games)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title or None)
    with_progress = any("progress" in row for row in summary.values())  # suites with BALROG-style progress (0-100)
    columns = ("env", "episodes", "mean reward", *(("progress",) if with_progress else ()), *(f"pass@{k}" for k in ks))
    for column in (*columns, "errors"):
        table.add_column(column, justify="left" if column in ("env", "errors") else "right")
    for env_id, row in summary.items():
        passes = [("-" if row["pass_at_k"].get(str(k)) is None else f"{row['pass_at_k'][str(k)]:.3f}") for k in ks]
        errors = ", ".join(f"{kind} {count}" for kind, count in row["errors"].items()) or "-"
        progress = row.get("progress")
        shown = [f"{progress['mean']:.1f} ± {progress['stderr']:.1f}" if progress else "-"] if with_progress else []
        reward = f"{row['mean_reward']:.3f} ± {row['stderr']:.3f}"
        table.add_row(env_id, str(row["episodes"]), reward, *shown, *passes, errors)
    console = Console()
    if not console.is_terminal:  # a pipe or a log has no width to fit: ids and errors stay whole, never cut or folded
        console = Console(width=table_width(table))
    console.print(table)


def table_width(table: Any) -> int:
    """The width `table` takes when no cell is cut or wrapped."""
    from rich.console import Console

    return Console(width=100_000).measure(table).maximum


def add_commands(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate an agent or model on envs: mean reward, pass@k, per-episode records")
    p.add_argument("envs", nargs="+", metavar="ENV", help="env ids (multi-agent games are played seat by seat)")
    p.add_argument("--agent", required=True, help="random, expert, openai:URL[#model], hf:DIR or smollm2")
    p.add_argument("-n", type=int, default=10, help="tasks (seeds) per env (default 10)")
    p.add_argument("-k", action="append", default=None, help="pass@k to report; repeat or comma-separate (default 1)")
    p.add_argument("--samples", type=int, default=None, help="attempts per task (default: the largest k)")
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight at once (default 8)")
    p.add_argument("--out", default=None, help="directory for summary.json and episodes.jsonl; re-running resumes")
    p.add_argument("--seed", type=int, default=0, help="first task seed (default 0)")
    p.add_argument("--opponent", default="random", help="multi-agent games: random, expert, scripted or an agent spec")
    p.add_argument(
        "--seats", type=int, nargs="+", default=[0, 1], choices=(0, 1), help="seats to play in multi-agent games"
    )
    p.add_argument(
        "--kwargs", default=None, help="JSON keyword arguments for every env, e.g. '{\"backend\": \"bwrap\"}'"
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="for openai: agents (default $OPENAI_API_KEY) and vllm: engines (default $ENVHUB_ENGINE_API_KEY)",
    )
    p.add_argument("--max-tokens", type=int, default=256, help="new tokens per model turn (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument(
        "--tool-mode",
        default="auto",
        choices=("auto", "native", "text"),
        help="openai: agents: native tool calls or tools in the prompt",
    )
    p.add_argument(
        "--max-turns",
        type=int,
        default=50,
        help="turns per episode before it is cut (default 50; the end counts the cut ones)",
    )
    p.add_argument(
        "--episode-timeout", type=float, default=300.0, help="seconds per episode before it is cut (default 300)"
    )
    p.add_argument(
        "--success-threshold", type=float, default=1.0, help="total reward that counts as a pass (default 1.0)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    harness_eval.add_options(p)
    add_import_option(p)
    p.set_defaults(handler=_cmd_eval)
