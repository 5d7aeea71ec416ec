"""`envhub serve`: run an env server (envhub's protocol or OpenEnv's, `envhub.server`) under the operator's policy and
limits."""

from __future__ import annotations

import argparse
import getpass
import ipaddress
import os
from typing import Any

from envhub.cli.imports import add_import_option
from envhub.errors import EnvhubError
from envhub.wire import TOKEN_ENV, endpoints_text


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve to anything


def _tokens(args: argparse.Namespace) -> list[str]:
    """The bearer tokens (--token, else ENVHUB_TOKEN); none is refused on a non-loopback address."""
    tokens = [t for t in (args.token or [os.environ.get(TOKEN_ENV, "")]) if t]
    if not tokens and not is_loopback(args.host):
        raise EnvhubError(
            f"refusing to serve on {args.host} without a token: anyone who can reach it could run envs on this host",
            hint=f"set {TOKEN_ENV} or pass --token, or bind 127.0.0.1",
        )
    return tokens


def _limits(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The ServerLimits and the session-table arguments (idle timeout, max sessions) the flags set."""
    from envhub.server.guard import ServerLimits

    limits = ServerLimits(
        **{k: v for k, v in vars(args).items() if k in ServerLimits.__dataclass_fields__ and v is not None}
    )
    table = {
        k: v for k, v in (("idle_timeout", args.idle_timeout), ("max_sessions", args.max_sessions)) if v is not None
    }
    return limits, table


def _policy(args: argparse.Namespace) -> Any:
    from envhub.server.policy import load_policy

    return load_policy(
        args.policy,
        envs=args.env or [],
        allow_kwargs=args.allow_kwarg or [],
        allow_options=args.allow_option or [],
        allow_local_backend=args.unsafe_allow_local_backend,
    )


def _run(app: Any, host: str, port: int) -> int:
    from aiohttp import web

    try:
        web.run_app(app, host=host, port=port, print=None, access_log=None)
    except OSError as exc:
        raise EnvhubError(
            f"cannot serve on {host}:{port}: {exc.strerror or exc}",
            hint="choose another --port, or stop what is using it",
        ) from None
    return 0


def _auth_line(tokens: list[str]) -> str:
    return f"bearer token required ({len(tokens)} token(s))" if tokens else "no token (loopback only)"


def _warn_local_backend(policy: Any) -> None:
    from envhub.server.policy import LOCAL_OPT_IN_FLAG

    if policy.allow_local_backend:
        print(
            f"envhub: WARNING {LOCAL_OPT_IN_FLAG}: clients' envs may run model-written code on this host as "
            f"{getpass.getuser()}, outside any sandbox",
            flush=True,
        )


def _serve_openenv(args: argparse.Namespace, tokens: list[str]) -> int:
    """One env in OpenEnv's protocol (envhub/server/openenv_server.py), behind the same guard and limits."""
    from envhub.server.openenv_server import OpenEnvServer

    if len(args.env or []) != 1:
        raise EnvhubError("--protocol openenv serves exactly one env", hint="pass one --env ID, e.g. --env Sokoban-v0")
    if args.allow_kwarg or args.allow_option:
        raise EnvhubError(
            "--protocol openenv takes no --allow-kwarg or --allow-option: OpenEnv clients set only seed and episode_id",
            hint="fix the env's kwargs server-side in the --policy file (kwargs:)",
        )
    limits, table = _limits(args)
    server = OpenEnvServer(args.env[0], policy=_policy(args), tokens=tokens, limits=limits, **table)
    print(
        f"envhub: serving {server.spec.id} in OpenEnv's protocol on http://{args.host}:{args.port} (/ws, /reset, "
        f"/step, /schema, /health; policy: {server.policy.source}; {_auth_line(tokens)}; idle timeout "
        f"{server.table.idle_timeout:g}s)",
        flush=True,
    )
    _warn_local_backend(server.policy)
    return _run(server.app(), args.host, args.port)


def _cmd_serve(args: argparse.Namespace) -> int:
    from envhub.server.env_server import EnvServer

    tokens = _tokens(args)
    if args.protocol == "openenv":
        return _serve_openenv(args, tokens)
    policy = _policy(args)
    limits, table = _limits(args)
    server = EnvServer(**table, policy=policy, tokens=tokens, limits=limits)
    served = (
        "every registered env"
        if policy.served is None
        else f"{len(policy.served)} env(s): {', '.join(sorted(policy.served))}"
    )
    print(
        f"envhub: serving {served} on http://{args.host}:{args.port} (policy: {policy.source}; {_auth_line(tokens)}; "
        f"idle timeout {server.idle_timeout:g}s)",
        flush=True,
    )
    _warn_local_backend(policy)
    return _run(server.app(), args.host, args.port)


def add_commands(sub: Any) -> None:
    epilog = (
        "endpoints (JSON; errors are {\"error\", \"hint\"}; every one but /health needs `Authorization: Bearer TOKEN` "
        "when the server has a token):\n"
        + endpoints_text()
        + "\n\n--protocol openenv serves one --env in OpenEnv's protocol (/ws, /reset, /step, /schema, /health) "
        "behind the same tokens and limits; its clients set only seed and episode_id"
        + "\n\nsecurity: clients set only the kwargs the policy allows (403 otherwise); see docs/security.md"
    )
    p = sub.add_parser(
        "serve",
        help="serve registered envs over HTTP (one session per episode)",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_binding_args(p)
    _add_policy_args(p)
    _add_limit_args(p)
    p.set_defaults(handler=_cmd_serve)


def _add_binding_args(p: argparse.ArgumentParser) -> None:
    """Where and how the server listens: address, port, protocol, tokens, modules to import."""
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other address needs a token)"
    )
    p.add_argument("--port", type=int, default=8765, help="port to bind (default 8765)")
    p.add_argument(
        "--protocol",
        choices=("envhub", "openenv"),
        default="envhub",
        help="envhub's session API, or OpenEnv's /ws protocol (one env, given with --env)",
    )
    p.add_argument(
        "--token",
        action="append",
        help="bearer token clients must send (repeatable, one per client; default $ENVHUB_TOKEN)",
    )


def _add_policy_args(p: argparse.ArgumentParser) -> None:
    """What is served and what clients may set (the operator's policy)."""
    p.add_argument(
        "--policy",
        default=None,
        help="YAML policy file: served envs, server-side kwargs, client-settable kwargs and options with bounds",
    )
    p.add_argument(
        "--env",
        action="append",
        metavar="ID",
        help="serve only this env id (repeatable; default every registered single-agent env)",
    )
    p.add_argument(
        "--allow-kwarg",
        action="append",
        metavar="ID:NAME",
        help="let clients set kwarg NAME of env ID to any value of its type (repeatable; envhub protocol only)",
    )
    p.add_argument(
        "--allow-option",
        action="append",
        metavar="ID:NAME",
        help="let clients send reset option NAME to env ID (repeatable; envhub protocol only)",
    )
    p.add_argument(
        "--unsafe-allow-local-backend",
        action="store_true",
        help="allow envs with backend 'local': model-written code runs on THIS HOST, unsandboxed",
    )
    add_import_option(p)


def _add_limit_args(p: argparse.ArgumentParser) -> None:
    """Per-client and per-request limits (ServerLimits) and the session table's caps (both protocols)."""
    p.add_argument(
        "--idle-timeout", type=float, default=None, help="seconds before an idle session is closed (default 600)"
    )
    p.add_argument(
        "--max-sessions", type=int, default=None, help="sessions held at once, more get HTTP 429 (default 1024)"
    )
    p.add_argument(
        "--sessions-per-client", type=int, default=None, help="sessions one token (or IP) holds at once (default 256)"
    )
    p.add_argument(
        "--rate-limit",
        type=float,
        default=None,
        help="requests (or WebSocket messages) per second per client, 429 + Retry-After above (default 500; 0 = off)",
    )
    p.add_argument(
        "--max-body", type=int, default=None, help="bytes of a request body or WebSocket message (default 2097152)"
    )
    p.add_argument(
        "--max-action-chars",
        type=int,
        default=None,
        help="characters of one action (default 131072, the envs' action space)",
    )
    p.add_argument("--body-timeout", type=float, default=None, help="seconds to receive a request body (default 30)")
    p.add_argument(
        "--step-timeout",
        type=float,
        default=None,
        help="seconds an env reset or step may take before the session is closed (default 900)",
    )
