"""What `envhub serve-engine` lets a client do: the API key, where it may listen, which weights it may load.

- `--api-key KEY`: every route needs `Authorization: Bearer KEY` (compared in constant time) except
  `/health*`, `/ready*` and `/metrics*`, which SGLang leaves open for probes; otherwise 401.
- `admin_api_key` (SGLang's `--admin-api-key`): the weight, pause, abort and flush routes need it and refuse
  the plain API key; without it they take the API key like every other route.
- A non-loopback `--host` without an API key refuses to start.
- `/update_weights_from_disk` loads only safetensors under the directories the operator allows
  (`--allow-weights-dir`, repeatable; default: the server's own weights directory).
- A request body not received within `BODY_TIMEOUT_S` (60 s) is answered 408, as the env servers do.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from envhub.errors import EngineError

API_KEY_ENV = "ENVHUB_ENGINE_API_KEY"
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
BODY_TIMEOUT_S = 60.0  # seconds to receive a request body (a 64 MB tensor push included)


def default_weights_dir() -> Path:
    """The server's own weights directory: $ENVHUB_CACHE/engine-weights (default ~/.cache/envhub)."""
    root = Path(os.environ.get("ENVHUB_CACHE") or Path.home() / ".cache" / "envhub")
    return root / "engine-weights"


def bearer_matches(header: str | None, api_key: str) -> bool:
    """True when `header` is `Bearer <api_key>` (scheme case-insensitive, key compared in constant time)."""
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return secrets.compare_digest(token.encode("utf-8", "surrogateescape"), api_key.encode("utf-8"))


def api_key_middleware(
    api_key: str | None, admin_api_key: str | None = None
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """aiohttp middleware answering 401 to requests without the key their route needs (probes and OPTIONS pass)."""
    from envhub.trainer.engines.protocol import ADMIN_ROUTES

    @web.middleware
    async def check(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        key = admin_api_key if admin_api_key and request.path in ADMIN_ROUTES else api_key
        if (
            key
            and request.method != "OPTIONS"
            and not request.path.startswith(OPEN_PREFIXES)
            and not bearer_matches(request.headers.get("Authorization"), key)
        ):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


def body_deadline_middleware(timeout_s: float) -> Callable[..., Awaitable[web.StreamResponse]]:
    """aiohttp middleware answering 408 to a request whose body is not received within `timeout_s` seconds (a client
    trickling bytes cannot hold a handler); the body read here is cached for the handler."""

    @web.middleware
    async def deadline(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.body_exists:
            try:
                await asyncio.wait_for(request.read(), timeout_s)
            except TimeoutError:
                message = f"request body not received within {timeout_s:g}s: send the whole body at once"
                return web.json_response({"error": {"message": message}}, status=408)
        return await handler(request)

    return deadline


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond this machine without an API key."""
    if not api_key and not is_loopback(host):
        raise EngineError(
            f"refusing to serve on {host} without an API key: anyone who reaches it could load weights and generate",
            hint=f"pass --api-key KEY (or set {API_KEY_ENV}), or bind to 127.0.0.1",
        )


@dataclass(frozen=True)
class WeightsPolicy:
    """Directories whose safetensors a client may ask the server to load."""

    allowed: tuple[Path, ...]

    @classmethod
    def of(cls, dirs: Any) -> WeightsPolicy:
        """From operator-given directories (resolved now, so later symlink swaps do not widen them)."""
        return cls(tuple(Path(d).expanduser().resolve() for d in dirs))

    def check(self, model_path: Any, load_format: Any = None) -> Path:
        """The resolved path to load, or EngineError naming why it is refused."""
        if load_format not in (None, "auto", "safetensors"):
            raise EngineError(f"load_format {load_format!r} is refused: this server loads safetensors only")
        if not isinstance(model_path, str) or not model_path or "\x00" in model_path:
            raise EngineError("model_path must be a non-empty string")
        path = Path(model_path).expanduser().resolve()
        if not any(path == d or path.is_relative_to(d) for d in self.allowed):
            raise EngineError(
                f"model_path {model_path} is outside the directories this server loads weights from",
                hint="start serve-engine with --allow-weights-dir DIR for the trainer's weights directory",
            )
        if path.is_file():
            if path.suffix != ".safetensors":
                raise EngineError(f"{model_path} is not a .safetensors file: this server loads safetensors only")
        elif not path.is_dir() or not any(path.glob("*.safetensors")):
            raise EngineError(f"no safetensors weights at {model_path}")
        return path
