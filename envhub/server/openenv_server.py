"""`envhub serve --protocol openenv`: one envhub env served in OpenEnv's protocol (aiohttp).

Routes, as OpenEnv's `openenv-core` server has them:
  WS   /ws        one session (one env) per connection; messages {"type": "reset"|"step"|"state"|"close", "data": {...}}
                  -> {"type": "observation", "data": {"observation": {...}, "reward", "done"}}
                   | {"type": "state", ...} | {"type": "error", "data": {"message", "code"}}
  GET  /health    {"status": "healthy", "sessions", "max_sessions", "reaped", "timed_out"} (no token needed)
  GET  /schema    JSON schemas of action {"text"}, observation {"text", "info", "truncated"} and state
  GET  /metadata  name and description of the served env
  GET  /state     the state of a fresh env (OpenEnv's HTTP routes are stateless)
  POST /reset     {"seed"?, "episode_id"?} -> a fresh env reset once, then closed
  POST /step      {"action": {"text"}, "seed"?} -> a fresh env reset and stepped once, then closed

Clients are hostile, and meet the same trust layer as `envhub serve`: the `ClientGuard` (bearer tokens,
per-client rate limit - requests over it get 429, WebSocket messages wait their turn -, body and message
size, JSON depth) and the `SessionTable` (per-client and server
session caps, idle reaping, env calls cut off after `step_timeout`); the stateless routes hold a session
for the length of their request. The env and its kwargs are the operator's (`--env`, `--policy`); a
client may set only `seed` and `episode_id`. Errors keep OpenEnv's shapes: HTTP `{"detail": ...}` (401,
413, 422, 429 with Retry-After, 504), WebSocket `{"type": "error", "data": {"message", "code"}}`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from envhub.errors import ConfigError, EnvhubError, ResetNeeded
from envhub.server.guard import CLIENT, ClientGuard, HTTPError, ServerLimits, check_seed, parse_json
from envhub.server.policy import PolicyRefused, ServePolicy
from envhub.server.sessions import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_SESSIONS, Session, SessionTable
from envhub.wire import json_safe

ACTION_SCHEMA = {
    "title": "EnvhubAction",
    "type": "object",
    "properties": {"text": {"type": "string", "description": "the agent's reply (raw model text or a tool call)"}},
    "required": ["text"],
}
OBSERVATION_SCHEMA = {
    "title": "EnvhubObservation",
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "info": {"type": "object"},
        "truncated": {"type": "boolean"},
        "done": {"type": "boolean"},
        "reward": {"type": ["number", "null"]},
    },
}
STATE_SCHEMA = {
    "title": "State",
    "type": "object",
    "properties": {
        "episode_id": {"type": ["string", "null"]},
        "step_count": {"type": "integer"},
        "env_id": {"type": "string"},
    },
}
RESET_FIELDS = frozenset({"seed", "episode_id"})  # all an OpenEnv client may set (ResetRequest's fields)
STEP_FIELDS = frozenset({"action", "seed", "episode_id", "timeout_s", "request_id"})  # StepRequest's, and our seed
ACTION_FIELDS = frozenset({"text", "tool_call", "metadata"})
MAX_EPISODE_ID = 255  # OpenEnv's ResetRequest bound
WS_CODES = {409: "EXECUTION_ERROR", 504: "EXECUTION_ERROR"}  # OpenEnv's WSErrorCode of a refusal, by HTTP status


@dataclass
class _Episode:
    """What OpenEnv's `state` reports about a WebSocket session's episode."""

    episode_id: str | None = None
    step_count: int = 0


def ws_error(message: str, code: str) -> dict[str, Any]:
    """A WebSocket error reply in OpenEnv's shape (`WSErrorResponse`)."""
    return {"type": "error", "data": {"message": message, "code": code}}


class OpenEnvServer:
    """Serves `env_id`, built with the operator's kwargs (the policy's), over OpenEnv's routes."""

    def __init__(
        self,
        env_id: str,
        *,
        policy: ServePolicy | None = None,
        tokens: tuple[str, ...] | list[str] = (),
        limits: ServerLimits | None = None,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        from envhub.registry import spec

        self.spec = spec(env_id)  # unknown ids fail at start, with suggestions
        if self.spec.multiagent:
            raise EnvhubError(
                f"{self.spec.id} is multi-agent; OpenEnv serves one agent", hint="serve its -SelfPlay- id"
            )
        self.policy = policy or ServePolicy()
        if not self.policy.serves(self.spec.id):
            raise ConfigError(
                f"{self.spec.id} is not served by the policy ({self.policy.source})",
                hint=f"add {self.spec.id} to the policy file's envs:",
            )
        try:  # the operator's kwargs; `backend: local` needs the operator's explicit opt-in
            self.env_kwargs = self.policy.kwargs_for(self.spec, {})
        except PolicyRefused as exc:
            raise ConfigError(str(exc.args[0]), hint=exc.hint) from None
        self.limits = limits or ServerLimits()
        self.guard = ClientGuard(tokens, self.limits)
        self.table = SessionTable(self.limits, idle_timeout, max_sessions, on_sweep=self.guard.forget_idle)

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self._errors, self.guard.middleware], client_max_size=self.limits.max_body)
        app.router.add_get("/health", self.health)
        app.router.add_get("/schema", self.schema)
        app.router.add_get("/metadata", self.metadata)
        app.router.add_get("/state", self.state)
        app.router.add_post("/reset", self.reset)
        app.router.add_post("/step", self.step)
        app.router.add_get("/ws", self.websocket)
        app.on_startup.append(self.table.start)
        app.on_shutdown.append(self.table.stop)  # before aiohttp waits for handlers: open sockets are closed
        return app

    # -- plumbing -----------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except HTTPError as exc:  # FastAPI, which OpenEnv's server runs on, answers invalid input with 422
            status = 422 if exc.status == 400 else exc.status
            return web.json_response({"detail": exc.error}, status=status, headers=exc.headers)
        except web.HTTPException as exc:  # aiohttp's own 404/405 for unknown routes
            if exc.status < 400:
                raise
            return web.json_response({"detail": exc.reason}, status=exc.status)
        except Exception as exc:  # an env that crashed must not take the server down
            return web.json_response({"detail": f"{type(exc).__name__}: {exc}"}, status=500)

    def _make(self) -> Any:
        from envhub.registry import make

        return make(self.spec.id, **self.env_kwargs)

    @contextlib.asynccontextmanager
    async def _request_session(self, request: web.Request) -> AsyncIterator[Session]:
        """A session for one stateless request: counted against the caps, closed at the end."""
        session = await self.table.open(request[CLIENT], self.spec.id, self._make)
        try:
            async with session.lock:
                yield session
        finally:
            await self.table.close(session)

    @staticmethod
    def _only(data: Any, allowed: frozenset[str], what: str) -> dict[str, Any]:
        """`data` as an object with no field outside `allowed`: client-set kwargs and options are refused."""
        if not isinstance(data, dict):
            raise HTTPError(400, f"{what} must be a JSON object")
        extra = sorted(set(data) - allowed)
        if extra:
            why = "" if allowed is ACTION_FIELDS else ": env kwargs and options are the operator's on this server"
            raise HTTPError(
                400, f"{what} may carry only {', '.join(sorted(allowed))}, not {', '.join(map(repr, extra))}{why}"
            )
        return data

    def _reset_args(self, data: dict[str, Any]) -> tuple[int | None, str | None]:
        episode_id = data.get("episode_id")
        if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > MAX_EPISODE_ID):
            raise HTTPError(400, f"'episode_id' must be a string of at most {MAX_EPISODE_ID} characters or null")
        return check_seed(data.get("seed")), episode_id

    def _action(self, data: Any) -> str | dict[str, Any]:
        data = self._only(data, ACTION_FIELDS, "the action")
        if isinstance(data.get("text"), str):
            return self.guard.check_action(data["text"])
        if isinstance(data.get("tool_call"), dict):
            return self.guard.check_action(data["tool_call"])
        raise HTTPError(400, "the action needs a string 'text' field")

    @staticmethod
    def _observation(
        obs: Any, reward: float | None, done: bool, truncated: bool, info: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "observation": {"text": json_safe(obs), "info": json_safe(info), "truncated": truncated},
            "reward": reward,
            "done": done,
        }

    # -- HTTP routes --------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy", **self.table.counters()})

    async def schema(self, request: web.Request) -> web.Response:
        return web.json_response({"action": ACTION_SCHEMA, "observation": OBSERVATION_SCHEMA, "state": STATE_SCHEMA})

    async def metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": self.spec.id,
                "description": self.spec.description,
                "version": None,
                "author": "envhub",
                "readme_content": None,
                "documentation_url": None,
            }
        )

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response({"episode_id": None, "step_count": 0, "env_id": self.spec.id})

    async def reset(self, request: web.Request) -> web.Response:
        body = self._only(await self.guard.read_json(request), RESET_FIELDS, "a reset request")
        seed, _ = self._reset_args(body)
        async with self._request_session(request) as session:
            obs, info = await self.table.run(session, "reset", seed=seed)
        return web.json_response(self._observation(obs, None, False, False, info))

    async def step(self, request: web.Request) -> web.Response:
        body = self._only(await self.guard.read_json(request), STEP_FIELDS, "a step request")
        action = self._action(body.get("action"))
        seed, _ = self._reset_args(body)
        async with self._request_session(request) as session:  # stateless: a fresh env, reset with the seed, stepped
            await self.table.run(session, "reset", seed=seed)
            obs, reward, terminated, truncated, info = await self.table.run(session, "step", action)
        return web.json_response(
            self._observation(obs, float(reward), bool(terminated or truncated), bool(truncated), info)
        )

    # -- WebSocket sessions -------------------------------------------------------------------
    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=self.limits.max_body, heartbeat=30.0)
        await ws.prepare(request)
        client = request[CLIENT]
        try:
            session = await self.table.open(client, self.spec.id, self._make)
        except HTTPError as exc:  # a session cap: OpenEnv tells the client on the socket, then closes it
            await ws.send_json(ws_error(exc.error, "CAPACITY_REACHED"))
            await ws.close()
            return ws
        except Exception as exc:
            await ws.send_json(ws_error(f"cannot make {self.spec.id}: {exc}", "FACTORY_ERROR"))
            await ws.close()
            return ws
        session.on_close = lambda: ws.close(code=WSCloseCode.GOING_AWAY, message=b"session closed by the server")
        episode = _Episode()
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    break  # a close, an error (a message over max_body closes with 1009) or binary data
                session.last_used = time.monotonic()
                reply = await self._reply(session, episode, client, message.data)
                if reply is None:
                    break
                await ws.send_json(reply)
                session.last_used = time.monotonic()  # idle from the answer on: pacing and sending are the server's
                if session.id not in self.table.sessions:
                    break  # cut off after step_timeout: the session is gone, and so is the socket
        finally:
            await self.table.close(session)
            await ws.close()
        return ws

    async def _reply(self, session: Session, episode: _Episode, client: str, raw: str) -> dict[str, Any] | None:
        """The reply to one client message; None for `close`."""
        await self.guard.pace(client)  # each message counts against the client's rate; over it, it waits its turn
        try:
            message = parse_json(raw)
        except HTTPError as exc:
            return ws_error(f"Invalid JSON: {exc.error}", "INVALID_JSON")
        if not isinstance(message, dict):
            return ws_error("a message must be a JSON object", "VALIDATION_ERROR")
        kind, data = message.get("type"), message.get("data") or {}
        try:
            if kind == "reset":
                return await self._ws_reset(session, episode, data)
            if kind == "step":
                return await self._ws_step(session, episode, data)
            if kind == "state":
                state = {"episode_id": episode.episode_id, "step_count": episode.step_count, "env_id": self.spec.id}
                return {"type": "state", "data": state}
            if kind == "close":
                return None
            return ws_error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")
        except HTTPError as exc:
            return ws_error(exc.error, WS_CODES.get(exc.status, "VALIDATION_ERROR"))
        except ResetNeeded as exc:
            session.needs_reset = True
            return ws_error(str(exc), "EXECUTION_ERROR")
        except Exception as exc:  # the env raised: the session survives, the client is told
            return ws_error(f"{type(exc).__name__}: {exc}", "EXECUTION_ERROR")

    async def _ws_reset(self, session: Session, episode: _Episode, data: Any) -> dict[str, Any]:
        seed, episode_id = self._reset_args(self._only(data, RESET_FIELDS, "reset data"))
        async with session.lock:
            obs, info = await self.table.run(session, "reset", seed=seed)
            session.needs_reset = False
        episode.episode_id, episode.step_count = episode_id or uuid.uuid4().hex, 0
        return {"type": "observation", "data": self._observation(obs, None, False, False, info)}

    async def _ws_step(self, session: Session, episode: _Episode, data: Any) -> dict[str, Any]:
        action = self._action(data)
        if session.needs_reset:
            raise HTTPError(409, "step before reset, or after the episode ended: send a reset first")
        async with session.lock:
            obs, reward, terminated, truncated, info = await self.table.run(session, "step", action)
            session.needs_reset = bool(terminated or truncated)
        episode.step_count += 1
        return {
            "type": "observation",
            "data": self._observation(obs, float(reward), session.needs_reset, bool(truncated), info),
        }
