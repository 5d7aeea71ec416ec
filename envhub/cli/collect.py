"""`envhub collect ENV --agent expert -n N --out F.jsonl`: expert episodes as chat-format JSONL (see
`envhub.trainer.collect`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from envhub.cli.imports import add_import_option
from envhub.errors import ConfigError


def _cmd_collect(args: argparse.Namespace) -> int:
    try:
        kwargs = json.loads(args.kwargs) if args.kwargs else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--kwargs is not JSON: {exc}", hint='e.g. --kwargs \'{"difficulty": 1}\'') from None
    if args.n < 1:
        raise ConfigError(f"-n must be at least 1, got {args.n}")
    from envhub.trainer.collect import collect

    demos = asyncio.run(collect(args.env, args.n, args.out, args.agent, args.seed, args.min_reward, env_kwargs=kwargs))
    mean = sum(d.reward for d in demos) / len(demos) if demos else 0.0
    print(f"wrote {len(demos)} episodes of {args.env} to {args.out} (mean reward {mean:.3f})", file=sys.stderr)
    return 0


def add_commands(sub: Any) -> None:
    """Register `envhub collect`."""
    p = sub.add_parser("collect", help="record expert episodes as chat-format JSONL (SFT warm-start data)")
    p.add_argument("env", help="env id, e.g. Sokoban-v0")
    p.add_argument("--agent", default="expert", help="who plays (expert: the env's solver)")
    p.add_argument("-n", type=int, default=32, help="episodes (seeds --seed .. --seed+n-1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output JSONL path")
    p.add_argument("--kwargs", default="", help="env kwargs as JSON")
    p.add_argument("--min-reward", type=float, default=None, help="keep only episodes with at least this return")
    add_import_option(p)
    p.set_defaults(handler=_cmd_collect)
