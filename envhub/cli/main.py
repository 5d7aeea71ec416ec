"""The `envhub` command line. Errors are one line plus a hint, with a non-zero exit code.

Subsystems add their own subcommands: each module in `SUBCOMMAND_MODULES` defines
`add_commands(subparsers)` and imports anything heavy only inside its handlers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from envhub.cli.imports import add_import_option, apply_imports
from envhub.errors import EnvhubError

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "envhub.cli.play",
    "envhub.cli.serve",
    "envhub.cli.eval",
    "envhub.cli.sandbox",
    "envhub.cli.swe",
    "envhub.cli.serve_engine",
    "envhub.cli.train",
    "envhub.cli.view",
    "envhub.cli.plan",
    "envhub.cli.collect",
    "envhub.cli.init",
)


def _cmd_list(args: argparse.Namespace) -> int:
    from envhub.availability import unavailable
    from envhub.registry import list_envs

    specs = list_envs(tag=args.tag)
    if args.source:
        sources = sorted({s.source for s in specs})
        specs = [s for s in specs if s.source == args.source]
        if not specs:
            print(f"no environment comes from {args.source!r}; sources here: {', '.join(sources)}", file=sys.stderr)
            return 1
    why = {s.id: unavailable(s) for s in specs}
    if args.available:
        specs = [s for s in specs if not why[s.id]]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": s.id,
                        "tags": list(s.tags),
                        "description": s.description,
                        "source": s.source,
                        "available": not why[s.id],
                        **({"unavailable": why[s.id]} if why[s.id] else {}),
                    }
                    for s in specs
                ],
                indent=2,
            )
        )
        return 0
    if not specs:
        print(f"no environment has tag {args.tag!r}" if args.tag else "no environments registered")
        return 1 if args.tag else 0
    width = max(len(s.id) for s in specs)
    for s in specs:
        tags = ",".join(s.tags)
        origin = "" if s.source == "envhub" else f"  [{s.source}]"
        mark = "  (unavailable here: `envhub info` says why)" if why[s.id] else ""
        print(f"{s.id:<{width}}  {tags:<32}  {s.description}{origin}{mark}")
    hidden = sum(1 for reason in why.values() if reason)
    if hidden and not args.available:
        print(f"\n{hidden} ids cannot run on this machine (marked); `envhub list --available` hides them")
    if args.tag is None and args.source is None:  # the adapted families' counts close the full listing
        from envhub.envs.adapters.family import family_lines

        print("\nadapted families (docs/adapters.md):\n  " + "\n  ".join(family_lines()))
    return 0


def _print_kwargs(env_spec: Any) -> None:
    """The constructor's kwargs with types and defaults; values the registration sets are marked."""
    from envhub.envinfo import constructor_kwargs

    kwargs, open_ended = constructor_kwargs(env_spec.load())
    print("kwargs:       " + ("-" if not kwargs and not open_ended else ""))
    for k in kwargs:
        registered = (
            f"   (registered: {json.dumps(env_spec.kwargs[k.name], default=str)})" if k.name in env_spec.kwargs else ""
        )
        print(f"  {k.describe()}{registered}")
    if open_ended:
        print("  **kwargs     (more keywords are passed on)")


def _cmd_info(args: argparse.Namespace) -> int:
    from envhub.envinfo import reward_doc
    from envhub.registry import make, make_multiagent, spec

    env_spec = spec(args.id)
    print(
        f"id:           {env_spec.id}   (gym.make('{env_spec.gym_id}'))"
        if not env_spec.multiagent
        else f"id:           {env_spec.id}"
    )
    print(
        "entry point:  "
        + (env_spec.entry_point if isinstance(env_spec.entry_point, str) else env_spec.entry_point.__qualname__)
    )
    print(f"source:       {env_spec.source}")
    print(f"tags:         {', '.join(env_spec.tags) or '-'}")
    print(f"max steps:    {env_spec.max_episode_steps or '-'}")
    from envhub.availability import unmet

    missing = unmet(env_spec.requires)
    print("available:    " + ("yes" if missing is None else f"no: {missing[0]} ({missing[1]})"))
    _print_kwargs(env_spec)
    if missing is not None:  # its package cannot be asked for spaces or tools here
        return 0
    if env_spec.multiagent:
        env = make_multiagent(env_spec.id)
        print(f"agents:       {', '.join(env.possible_agents)}")
        print(f"doc:          {(type(env).__doc__ or '').strip().splitlines()[0] if type(env).__doc__ else '-'}")
        print(f"reward:       {reward_doc(type(env)) or '- (the env documents none)'}")
        env.close()
        return 0
    try:
        env = make(env_spec.id)
    except (TypeError, ValueError) as exc:  # e.g. a required kwarg: the list above says which
        raise EnvhubError(
            f"cannot build {env_spec.id} without kwargs to show its spaces and tools: {exc}",
            hint=f"see the kwargs above; try `envhub play {env_spec.id} --kwargs '{{...}}'`",
        ) from None
    try:
        unwrapped = env.unwrapped
        print(f"observation:  {env.observation_space}")
        print(f"action:       {env.action_space}")
        doc = (type(unwrapped).__doc__ or "").strip()
        if doc:
            print("about:\n  " + "\n  ".join(doc.splitlines()))
        print(f"reward:       {reward_doc(type(unwrapped)) or '- (the env documents none)'}")
        tools = [t.schema["function"] for t in getattr(unwrapped, "tools", ())]
        print("tools:        " + ("-" if not tools else ""))
        for t in tools:
            params = ", ".join(t["parameters"]["properties"])
            print(f"  {t['name']}({params}): {t['description']}")
    finally:
        env.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="envhub", description="A hub of agentic environments for LLM agents.")
    parser.add_argument("--version", action="version", version=f"envhub {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("list", help="list registered environments")
    p.add_argument("--tag", help="only environments with this tag (e.g. game, math, multi-agent)")
    p.add_argument("--source", help="only environments from this source (envhub for the bundled ones, textarena, ...)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--available",
        action="store_true",
        help="only environments this machine can run (`envhub info ID` says why not)",
    )
    add_import_option(p)
    p.set_defaults(handler=_cmd_list)
    p = sub.add_parser("info", help="show an environment's spaces, tools, reward and kwargs")
    p.add_argument("id")
    add_import_option(p)
    p.set_defaults(handler=_cmd_info)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).add_commands(sub)
    return parser


def _version() -> str:
    from envhub import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], Any] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        apply_imports(args)  # before the command resolves any env id
        code = int(handler(args) or 0)
        sys.stdout.flush()  # a reader that left (`envhub list | head`) shows here, not at exit
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return 141  # as a process killed by SIGPIPE: the reader stopped reading, nothing went wrong
    except EnvhubError as exc:
        message = str(exc.args[0]) if exc.args else str(exc)
        print(f"envhub: error: {message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("envhub: interrupted", file=sys.stderr)
        return 130


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not fail again on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
