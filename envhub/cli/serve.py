"""`envhub serve`: run the HTTP env server (see `envhub.server.env_server`) under the operator's policy and limits."""

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


def _cmd_serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from envhub.server.env_server import EnvServer
    from envhub.server.guard import ServerLimits
    from envhub.server.policy import LOCAL_OPT_IN_FLAG, load_policy

    tokens = [t for t in (args.token or [os.environ.get(TOKEN_ENV, "")]) if t]
    if not tokens and not is_loopback(args.host):
        raise EnvhubError(
            f"refusing to serve on {args.host} without a token: anyone who can reach it could run envs on this host",
            hint=f"set {TOKEN_ENV} or pass --token, or bind 127.0.0.1",
        )
    if args.protocol == "openenv":  # one env in OpenEnv's protocol (envhub/server/openenv_server.py)
        from envhub.server.openenv_server import serve

        if len(args.env or []) != 1:
            raise EnvhubError(
                "--protocol openenv serves exactly one env", hint="pass one --env ID, e.g. --env Sokoban-v0"
            )
        if len(tokens) > 1:
            raise EnvhubError("--protocol openenv takes one token", hint="pass --token once (or set ENVHUB_TOKEN)")
        return (
            serve(
                args.env[0],
                args.host,
                args.port,
                token=tokens[0] if tokens else None,
                max_sessions=args.max_sessions,
                idle_timeout=args.idle_timeout,
            )
            or 0
        )
    policy = load_policy(
        args.policy,
        envs=args.env or [],
        allow_kwargs=args.allow_kwarg or [],
        allow_options=args.allow_option or [],
        allow_local_backend=args.unsafe_allow_local_backend,
    )
    limits = ServerLimits(
        **{k: v for k, v in vars(args).items() if k in ServerLimits.__dataclass_fields__ and v is not None}
    )
    server_args = {
        k: v for k, v in (("idle_timeout", args.idle_timeout), ("max_sessions", args.max_sessions)) if v is not None
    }
    server = EnvServer(**server_args, policy=policy, tokens=tokens, limits=limits)
    served = (
        "every registered env"
        if policy.served is None
        else f"{len(policy.served)} env(s): {', '.join(sorted(policy.served))}"
    )
    auth = f"bearer token required ({len(tokens)} token(s))" if tokens else "no token (loopback only)"
    print(
        f"envhub: serving {served} on http://{args.host}:{args.port} (policy: {policy.source}; {auth}; idle timeout "
        f"{server.idle_timeout:g}s)",
        flush=True,
    )
    if policy.allow_local_backend:
        print(
            f"envhub: WARNING {LOCAL_OPT_IN_FLAG}: clients' envs may run model-written code on this host as "
            f"{getpass.getuser()}, outside any sandbox",
            flush=True,
        )
    try:
        web.run_app(server.app(), host=args.host, port=args.port, print=None, access_log=None)
    except OSError as exc:
        raise EnvhubError(
            f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}",
            hint="choose another --port, or stop what is using it",
        ) from None
    return 0


def add_commands(sub: Any) -> None:
    epilog = (
        "endpoints (JSON; errors are {\"error\", \"hint\"}; every one but /health needs `Authorization: Bearer TOKEN` "
        "when the server has a token):\n"
        + endpoints_text()
        + "\n\nsecurity: clients set only the kwargs the policy allows (403 otherwise); see docs/security.md"
    )
    p = sub.add_parser(
        "serve",
        help="serve registered envs over HTTP (one session per episode)",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; any other address needs a token)"
    )
    p.add_argument("--port", type=int, default=8765, help="port to bind (default 8765)")
    p.add_argument(
        "--token",
        action="append",
        help="bearer token clients must send (repeatable, one per client; default $ENVHUB_TOKEN)",
    )
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
        help="let clients set kwarg NAME of env ID to any value of its type (repeatable)",
    )
    p.add_argument(
        "--allow-option",
        action="append",
        metavar="ID:NAME",
        help="let clients send reset option NAME to env ID (repeatable)",
    )
    p.add_argument(
        "--unsafe-allow-local-backend",
        action="store_true",
        help="allow envs with backend 'local': model-written code runs on THIS HOST, unsandboxed",
    )
    add_import_option(p)
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
        help="requests per second per client, 429 + Retry-After above (default 500; 0 = off)",
    )
    p.add_argument("--max-body", type=int, default=None, help="bytes of a request body (default 2097152)")
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
    p.add_argument(
        "--protocol",
        choices=("envhub", "openenv"),
        default="envhub",
        help="envhub's session API, or OpenEnv's /ws protocol (one env, given with --env)",
    )
    p.set_defaults(handler=_cmd_serve)
