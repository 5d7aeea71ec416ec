"""`RemoteEnv`: an `AgentEnv` whose episodes run on an `envhub serve` server over HTTP.

Rollout code cannot tell it from a local env: `areset`/`astep`/`aclose` talk to the server with
aiohttp, and the sync methods drive them on envhub's background loop. Every request has a
timeout; a server that is gone or stops answering raises `RemoteError` naming the URL, never hangs.
Each reset opens a fresh server session (one session per episode) and closes the previous one; a step that
fails (env error, timeout, server gone) or is cancelled closes its session at once, and `with RemoteEnv(...)` /
`async with` close it however the block ends. Only refusals that never reached the env (400, 413, 429) keep it.
Construction does no I/O, so building many clients inside an event loop never blocks it; an
unknown id or an unreachable server is reported by the first `reset`.
The bearer token (`token=` or the ENVHUB_TOKEN environment variable) goes in every request's
`Authorization` header; a 429 with `Retry-After` (the server's rate limit) is waited out and retried
within `request_timeout`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

from envhub.core import AgentEnv, UnicodeText
from envhub.errors import EnvhubError, EnvNotFound, ResetNeeded
from envhub.wire import TOKEN_ENV

if TYPE_CHECKING:  # aiohttp is imported on first use, keeping `import envhub` light
    import aiohttp


class RemoteError(EnvhubError):
    """A remote env server that cannot be reached, stopped answering, or refused a request (`status`: its HTTP
    status, None when no answer came)."""

    def __init__(self, message: str, hint: str = "", status: int | None = None) -> None:
        super().__init__(message, hint)
        self.status = status


# Refusals of a request the server never passed to the env: the episode is intact and the session is kept.
_SESSION_INTACT = frozenset({400, 413, 429})


def _serve_hint(url: str) -> str:
    return (
        f"check that the server is running (`envhub serve --port {urllib.parse.urlsplit(url).port or 80}`) and "
        f"reachable at {url}"
    )


class RemoteEnv(AgentEnv):
    """The env `env_id` built with `kwargs` on the envhub server at `url` (token: argument, else $ENVHUB_TOKEN)."""

    def __init__(
        self,
        url: str,
        env_id: str,
        *,
        request_timeout: float = 120.0,
        connect_timeout: float = 5.0,
        token: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.url = url.rstrip("/")
        token = token or os.environ.get(TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}  # never logged or put in errors
        self.env_id = env_id
        self.env_kwargs = kwargs
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.session_id: str | None = None
        self._clients: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self.observation_space = UnicodeText()
        self.action_space = UnicodeText()

    # -- HTTP ---------------------------------------------------------------------------------
    async def _client(self) -> aiohttp.ClientSession:
        """This env's aiohttp session for the running loop (sync calls run on envhub's own loop,
        async calls on the caller's), created on first use so that it belongs to that loop."""
        import aiohttp

        loop = asyncio.get_running_loop()
        for gone in [other for other in self._clients if other.is_closed()]:
            await _abandon(self._clients.pop(gone))
        client = self._clients.get(loop)
        if client is None or client.closed:
            client = self._clients[loop] = aiohttp.ClientSession()
        return client

    async def _request(
        self, method: str, path: str, payload: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        import aiohttp

        limit = aiohttp.ClientTimeout(total=timeout or self.request_timeout, sock_connect=self.connect_timeout)
        deadline = time.monotonic() + limit.total
        try:
            while True:
                async with (await self._client()).request(
                    method, self.url + path, json=payload, timeout=limit, headers=self._headers
                ) as reply:
                    text = await reply.text()
                    status, retry_after = reply.status, reply.headers.get("Retry-After", "")
                wait = float(retry_after) if status == 429 and retry_after.isdigit() else None
                if wait is None or time.monotonic() + wait > deadline:
                    break
                await asyncio.sleep(wait)  # rate limited: the server says when to come back
        except TimeoutError:
            raise RemoteError(
                f"envhub server at {self.url} stopped answering: no reply to {method} {path} within {limit.total:g}s",
                hint=_serve_hint(self.url) + "; for slow envs raise RemoteEnv(request_timeout=...)",
            ) from None
        except aiohttp.ClientConnectorError as exc:
            what = "stopped answering mid-episode" if self.session_id is not None else "cannot be reached"
            raise RemoteError(
                f"envhub server at {self.url} {what}: {exc.os_error}", hint=_serve_hint(self.url)
            ) from None
        except aiohttp.ClientError as exc:
            raise RemoteError(
                f"envhub server at {self.url} stopped answering: {type(exc).__name__}: {exc}",
                hint=_serve_hint(self.url),
            ) from None
        body = _error_body(text) if status >= 400 else json.loads(text)
        if status < 400:
            return body
        if status == 401:
            raise RemoteError(
                f"envhub server at {self.url} refused {method} {path} (401): {body['error']}",
                hint=f"pass RemoteEnv(token=...) or set {TOKEN_ENV} to the server's token",
                status=401,
            )
        if status == 409:
            raise ResetNeeded(body["error"], hint=body.get("hint", "call reset()"))
        if status == 404 and path == "/sessions":
            raise EnvNotFound(body["error"], hint=body.get("hint", ""))
        raise RemoteError(
            f"envhub server at {self.url} refused {method} {path} ({status}): {body['error']}",
            hint=body.get("hint", ""),
            status=status,
        )

    # -- AgentEnv -----------------------------------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        await super().areset(seed=seed)  # seeds the local np_random, as gymnasium expects
        await self._close_session()
        reply = await self._request(
            "POST",
            "/sessions",
            {"env_id": self.env_id, "kwargs": self.env_kwargs, "reset": True, "seed": seed, "options": options},
        )
        self.session_id = reply["session_id"]
        for name in ("observation_space", "action_space"):
            described = reply.get(name) or {}
            current = getattr(self, name)
            if described.get("type") == "Text" and (current.min_length, current.max_length) != (
                described.get("min_length", 0),
                described["max_length"],
            ):
                setattr(self, name, UnicodeText(described["max_length"], min_length=described.get("min_length", 0)))
        return reply["observation"], reply["info"]

    async def astep(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.session_id is None:
            raise ResetNeeded(f"step() before reset() on remote {self.env_id}", hint="call reset() first")
        try:
            reply = await self._request("POST", f"/sessions/{self.session_id}/step", {"action": action})
        except RemoteError as exc:
            if exc.status not in _SESSION_INTACT:  # the env failed or the server is gone: the episode is over
                await self._close_session()
            raise
        except BaseException:  # cancelled by the caller (a watchdog, a cut group) or 409: free the session now
            await self._close_session()
            raise
        return (
            reply["observation"],
            float(reply["reward"]),
            bool(reply["terminated"]),
            bool(reply["truncated"]),
            reply["info"],
        )

    async def _close_session(self) -> None:
        sid, self.session_id = self.session_id, None
        if sid is not None:
            try:
                await self._request("DELETE", f"/sessions/{sid}", timeout=self.connect_timeout)
            except EnvhubError:
                pass  # the server reaps what it cannot be told about

    async def aclose(self) -> None:
        await self._close_session()
        current = asyncio.get_running_loop()
        clients, self._clients = self._clients, {}
        for loop, client in clients.items():
            if loop is current:
                await client.close()
            elif loop.is_running():  # e.g. envhub's background loop, when closed from the caller's
                asyncio.run_coroutine_threadsafe(client.close(), loop)
            else:
                await _abandon(client)

    async def health(self) -> dict[str, Any]:
        """The server's `/health` reply."""
        return await self._request("GET", "/health", timeout=self.connect_timeout)


async def _abandon(client: aiohttp.ClientSession) -> None:
    """Forget a session whose event loop has ended: it cannot be closed on that loop any more."""
    connector = client.connector
    client.detach()
    if connector is not None:
        try:
            await connector.close()  # with its loop closed this only drops the pooled connections
        except Exception:
            pass


def _error_body(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not isinstance(body, dict) or "error" not in body:
        return {"error": text.strip()[:500] or "no message"}
    return body
