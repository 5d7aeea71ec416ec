"""`envhub play ID`: a person (or a pipe) plays an environment in the terminal."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from envhub.cli.imports import add_import_option
from envhub.errors import ConfigError


def play(
    env_id: str, *, seed: int | None = None, kwargs: dict[str, Any] | None = None, stdin=None, stdout=None
) -> float:
    """Play one episode reading actions line by line; returns the episode's return."""
    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    interactive = stdin.isatty()
    env = _make(env_id, kwargs or {})
    total = 0.0
    try:
        obs, info = env.reset(seed=seed)
        if info.get("system_prompt"):
            print(f"[system] {info['system_prompt']}\n", file=out)
        if info.get("tools"):
            names = ", ".join(t["function"]["name"] for t in info["tools"])
            print(
                f"[tools] {names}   (write <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>)\n",
                file=out,
            )
        print(obs, file=out)
        steps = 0
        while True:
            if interactive:
                print("> ", end="", file=out, flush=True)
            line = stdin.readline()
            if not line:
                print("\n[end of input: episode stopped]", file=out)
                break
            action = line.rstrip("\n").replace("\\n", "\n")
            if not interactive:  # a terminal shows what was typed; a pipe does not
                print(f"> {line.rstrip()}", file=out)
            obs, reward, terminated, truncated, info = env.step(action)
            steps += 1
            total += float(reward)
            print(f"\n{obs}\n[step {steps}: reward {reward:+.3f}, return {total:+.3f}]", file=out)
            if terminated or truncated:
                print(
                    f"[episode {'finished' if terminated else 'truncated'} after {steps} steps, return {total:.3f}]",
                    file=out,
                )
                break
    finally:
        env.close()
    return total


def _make(env_id: str, kwargs: dict[str, Any]) -> Any:
    """Build the env, turning a kwarg it does not take or cannot use into one ConfigError."""
    from envhub.envinfo import check_kwargs
    from envhub.registry import make

    check_kwargs(env_id, kwargs)
    try:
        return make(env_id, **kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"cannot build {env_id} with kwargs {json.dumps(kwargs)}: {exc}",
            hint=f"`envhub info {env_id}` lists its kwargs with types and defaults",
        ) from None


def parse_kwargs(text: str) -> dict[str, Any]:
    """The `--kwargs` JSON object; ConfigError for anything else."""
    if not text:
        return {}
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"--kwargs is not valid JSON ({exc.msg} at column {exc.colno}): {text[:80]}",
            hint='write a JSON object, e.g. --kwargs \'{"slippery": true}\'',
        ) from None
    if not isinstance(kwargs, dict):
        raise ConfigError(
            f"--kwargs must be a JSON object, got {type(kwargs).__name__}", hint='e.g. --kwargs \'{"size": 5}\''
        )
    return kwargs


def _cmd_play(args: argparse.Namespace) -> int:
    kwargs = parse_kwargs(args.kwargs)
    play(args.id, seed=args.seed, kwargs=kwargs)
    return 0


def add_commands(sub: Any) -> None:
    p = sub.add_parser("play", help="play an environment in the terminal (one action per line; also reads a pipe)")
    p.add_argument("id")
    p.add_argument("--seed", type=int, default=None, help="episode seed (same seed, same episode)")
    p.add_argument("--kwargs", default="", help='JSON of env kwargs, e.g. \'{"slippery": true}\'')
    add_import_option(p)
    p.set_defaults(handler=_cmd_play)
