"""What both env servers check before a request reaches an env: bearer tokens, per-client rates, body size and shape.

A client is its token (when the server has tokens) or its IP address. Tokens are compared in
constant time (`hmac.compare_digest`) against every configured token. Each client has a token
bucket of requests; an empty bucket answers 429 with `Retry-After` (a WebSocket message waits
instead, so a socket is read no faster than its client's rate). Bodies are read with a size cap
and a deadline (a client trickling bytes cannot hold a handler), then parsed as JSON of bounded
nesting; WebSocket messages go through the same parser. Refusals are `HTTPError`s, which each
protocol renders in its own error shape.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from envhub.core import MAX_TEXT_LENGTH
from envhub.wire import TOKEN_ENV

MAX_JSON_DEPTH = 32
OPEN_PATHS = frozenset({"/health"})  # no token, no rate limit: load balancers and liveness probes
CLIENT: Any = (
    web.RequestKey("client", str) if hasattr(web, "RequestKey") else "client"
)  # who sent it: a token index or an IP (older aiohttp: a str key)


class HTTPError(Exception):
    """A request the server refuses, with its status code, message, hint and extra headers."""

    def __init__(self, status: int, error: str, hint: str = "", headers: dict[str, str] | None = None) -> None:
        super().__init__(error)
        self.status, self.error, self.hint, self.headers = status, error, hint, headers or {}


@dataclass(frozen=True)
class ServerLimits:
    """Per-request and per-client limits of both env servers (each has an `envhub serve` flag of the same name)."""

    max_body: int = 2 << 20  #: bytes of one request body or WebSocket message (413 above); fits a longest action
    max_action_chars: int = (
        MAX_TEXT_LENGTH  #: characters of one action, text or JSON-encoded tool call (413 above); the envs' action space
    )
    sessions_per_client: int = 256  #: sessions one token (or IP without tokens) holds at once (429 above)
    rate_limit: float = 500.0  #: requests per second per client, bursts of twice that (429 + Retry-After); 0 = off
    body_timeout: float = 30.0  #: seconds to receive a request body (408 after)
    step_timeout: float = 900.0  #: seconds an env's reset or step may take (504 after, and the session is closed)


class ClientGuard:
    """Authenticates requests and meters each client's request rate."""

    def __init__(self, tokens: Sequence[str] = (), limits: ServerLimits = ServerLimits()) -> None:
        self._tokens = [t.encode() for t in tokens if t]
        self.limits = limits
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens left, last refill time)

    @property
    def requires_token(self) -> bool:
        """Whether requests must carry `Authorization: Bearer TOKEN`."""
        return bool(self._tokens)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """aiohttp middleware: names the client (`request[CLIENT]`) and admits it, except on OPEN_PATHS."""
        if request.path not in OPEN_PATHS:
            request[CLIENT] = self.client_of(request)
            self.admit(request[CLIENT])
        return await handler(request)

    def client_of(self, request: web.Request) -> str:
        """The client's identity for limits; 401 when a token is required and missing or wrong."""
        if not self._tokens:
            return f"ip:{request.remote}"
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise HTTPError(
                401,
                "missing bearer token",
                f"send `Authorization: Bearer TOKEN` (RemoteEnv(token=...) or {TOKEN_ENV})",
                {"WWW-Authenticate": "Bearer"},
            )
        offered = given.strip().encode()
        matched = -1
        for index, token in enumerate(
            self._tokens
        ):  # every token is compared, so timing does not tell which one matched
            if hmac.compare_digest(offered, token):
                matched = index
        if matched < 0:
            raise HTTPError(
                401,
                "wrong bearer token",
                f"use the token the server was started with (--token or {TOKEN_ENV})",
                {"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        return f"token:{matched}"

    def admit(self, client: str) -> None:
        """Take one request from the client's bucket; 429 with Retry-After when it is empty."""
        rate = self.limits.rate_limit
        if rate <= 0:
            return
        now, capacity = time.monotonic(), self._capacity
        left, last = self._buckets.get(client, (capacity, now))
        left = min(capacity, left + (now - last) * rate)
        if left < 1:
            wait = (1 - left) / rate
            self._buckets[client] = (left, now)
            raise HTTPError(
                429,
                f"rate limit: more than {rate:g} requests per second from this client",
                "slow down and retry after the Retry-After seconds",
                {"Retry-After": str(max(1, math.ceil(wait)))},
            )
        self._buckets[client] = (left - 1, now)

    async def pace(self, client: str) -> None:
        """Take one request from the client's bucket, waiting for it when the bucket is empty (WebSocket messages:
        slowed to the client's rate, never refused, as a client that waits out Retry-After would be)."""
        rate = self.limits.rate_limit
        if rate <= 0:
            return
        now = time.monotonic()
        left, last = self._buckets.get(client, (self._capacity, now))
        left = min(self._capacity, left + (now - last) * rate) - 1  # below 0: owed, and waited for below
        self._buckets[client] = (left, now)
        if left < 0:
            await asyncio.sleep(-left / rate)

    @property
    def _capacity(self) -> float:
        # bursts of twice the rate, and never below one request (a rate under 0.5/s would otherwise refuse all)
        return max(1.0, 2 * self.limits.rate_limit)

    def forget_idle(self) -> None:
        """Drop full buckets, so that the table does not grow with every client ever seen."""
        now, rate = time.monotonic(), self.limits.rate_limit
        for client, (left, last) in list(self._buckets.items()):
            if left + (now - last) * rate >= self._capacity:
                del self._buckets[client]

    async def read_json(self, request: web.Request) -> dict[str, Any]:
        """The request's body as a JSON object ({} without a body), within the size cap, deadline and nesting depth."""
        if not request.can_read_body:
            return {}
        try:
            raw = await asyncio.wait_for(request.read(), self.limits.body_timeout)
        except web.HTTPRequestEntityTooLarge:
            raise HTTPError(
                413,
                f"request body over this server's limit of {self.limits.max_body} bytes",
                "send less; the operator raises it with --max-body",
            ) from None
        except TimeoutError:
            raise HTTPError(
                408, f"request body not received within {self.limits.body_timeout:g}s", "send the whole body at once"
            ) from None
        body = parse_json(raw)
        if not isinstance(body, dict):
            raise HTTPError(400, f"request body must be a JSON object, got {type(body).__name__}", "send a JSON object")
        return body

    def check_action(self, action: Any) -> str | dict[str, Any]:
        """`action` if it is a string or an object within `max_action_chars`; 400 or 413 otherwise."""
        if not isinstance(action, (str, dict)):
            raise HTTPError(400, f"'action' must be a string or an object, got {type(action).__name__}")
        size = len(action) if isinstance(action, str) else len(json.dumps(action))
        if size > self.limits.max_action_chars:
            raise HTTPError(
                413,
                f"action is {size} characters, over this server's limit of {self.limits.max_action_chars}",
                "send a shorter action; the operator sets --max-action-chars",
            )
        return action


def parse_json(raw: bytes | str) -> Any:
    """A request body or message as JSON, nested at most MAX_JSON_DEPTH levels; 400 otherwise."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # ValueError covers bad UTF-8 and over-long integers too
        raise HTTPError(400, f"request body is not valid JSON: {str(exc)[:200]}", "send a JSON object") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise HTTPError(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels", "send a flatter object")
    return value


def check_seed(seed: Any) -> int | None:
    """`seed` if it is null or an integer in [0, 2**64); 400 otherwise."""
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64):
        raise HTTPError(400, f"'seed' must be an integer in [0, 2**64) or null, got {str(seed)[:40]}")
    return seed


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_JSON_DEPTH:
            break
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
