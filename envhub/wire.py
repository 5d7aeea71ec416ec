"""What the envhub protocol's HTTP client (`envhub.RemoteEnv`) and server (`envhub serve`) share:
the route table, the bearer-token variable, and how values are made JSON-safe."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

TOKEN_ENV = "ENVHUB_TOKEN"  # the bearer token of `envhub serve`, read by the server and by the client

# The env server's routes (envhub.server.env_server), apart from it so that `envhub --help` does not import aiohttp.
ENDPOINTS = (
    ("GET", "/health", "", '{"status": "ok", "sessions", "max_sessions", "reaped", "timed_out"} (no token needed)'),
    ("GET", "/envs", "", "[{id, tags, description, multiagent, max_episode_steps}] of the served envs"),
    ("GET", "/envs/{env_id}", "", "one of the above"),
    (
        "POST",
        "/sessions",
        '{"env_id", "kwargs"?, "reset"?, "seed"?, "options"?}',
        '{"session_id", "observation_space", "action_space"[, "observation", "info"]}',
    ),
    ("POST", "/sessions/{id}/reset", '{"seed"?, "options"?}', '{"observation", "info"}'),
    (
        "POST",
        "/sessions/{id}/step",
        '{"action": text | tool-call object}',
        '{"observation", "reward", "terminated", "truncated", "info"}',
    ),
    ("DELETE", "/sessions/{id}", "", '{"closed": id}'),
)


def endpoints_text() -> str:
    """The endpoint table of `envhub.server.env_server`, for `envhub serve --help` (404/405 answers list ENDPOINTS
    too)."""
    return "\n".join(f"  {method:<6} {path:<22} {body:<52} -> {reply}" for method, path, body, reply in ENDPOINTS)


def json_safe(value: Any, depth: int = 0) -> Any:
    """`value` made JSON-serialisable: numpy to lists/numbers, dataclasses to dicts, the rest to str."""
    if depth > 32:
        return repr(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.generic):
        return json_safe(value.item(), depth + 1)
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist(), depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value), depth + 1)
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return repr(value)
