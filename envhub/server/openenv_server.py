"""`envhub serve --protocol openenv`: one envhub env served in OpenEnv's protocol (aiohttp).

Routes, as OpenEnv's `openenv-core` server has them:
  WS   /ws        one session (one env) per connection; messages {"type": "reset"|"step"|"state"|"close", "data": {...}}
                  -> {"type": "observation", "data": {"observation": {...}, "reward", "done"}}
                   | {"type": "state", ...} | {"type": "error", ...}
  GET  /health    {"status": "healthy"}
  GET  /schema    JSON schemas of action {"text"}, observation {"text", "info", "truncated"} and state
  GET  /metadata  name and description of the served env
  GET  /state     the state of a fresh env (OpenEnv's HTTP routes are stateless)
  POST /reset     {"seed"?} -> a fresh env reset once, then closed
  POST /step      {"action": {"text"}, "seed"?} -> a fresh env reset and stepped once, then closed

Clients are hostile: env kwargs are the operator's (`--env`), never the client's; reset honours
only `seed` and `episode_id`; messages are capped in size, sessions in number and idle time, and a
bearer token is required when `token` is set.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from envhub.errors import EnvhubError, ResetNeeded
from envhub.server.env_server import _sync_only
from envhub.wire import json_safe

MAX_MESSAGE_BYTES = 1 << 20
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


@dataclass
class _Session:
    env: Any
    episode_id: str | None = None
    step_count: int = 0
    done: bool = True
    last_used: float = field(default_factory=time.monotonic)


class ClientError(Exception):
    """A message the server refuses, with OpenEnv's error code."""

    def __init__(self, message: str, code: str = "VALIDATION_ERROR") -> None:
        super().__init__(message)
        self.code = code


class OpenEnvServer:
    """Serves `env_id` (built with the operator's `env_kwargs`) over OpenEnv's routes."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        token: str | None = None,
        max_sessions: int = 256,
        idle_timeout: float = 600.0,
    ) -> None:
        from envhub.registry import spec

        self.spec = spec(env_id)  # unknown ids fail at start, with suggestions
        if self.spec.multiagent:
            raise EnvhubError(
                f"{self.spec.id} is multi-agent; OpenEnv serves one agent", hint="serve its -SelfPlay- id"
            )
        self.env_kwargs = dict(env_kwargs or {})
        self.token = token
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.sessions: dict[str, _Session] = {}

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_MESSAGE_BYTES)
        app.router.add_get("/health", self.health)
        app.router.add_get("/schema", self.schema)
        app.router.add_get("/metadata", self.metadata)
        app.router.add_get("/state", self.state)
        app.router.add_post("/reset", self.reset)
        app.router.add_post("/step", self.step)
        app.router.add_get("/ws", self.websocket)
        return app

    # -- plumbing -----------------------------------------------------------------------------
    def authorized(self, request: web.Request) -> bool:
        """True when no token is set or the request carries it as a bearer token (constant-time compare)."""
        if not self.token:
            return True
        sent = request.headers.get("Authorization", "")
        return hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode())

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/health" and not self.authorized(request):
            return web.json_response({"detail": "missing or wrong bearer token"}, status=401)
        try:
            return await handler(request)
        except ClientError as exc:
            return web.json_response({"detail": str(exc)}, status=422)
        except web.HTTPException:
            raise
        except Exception as exc:  # an env that crashed must not take the server down
            return web.json_response({"detail": f"{type(exc).__name__}: {exc}"}, status=500)

    def _make(self) -> Any:
        from envhub.registry import make

        return make(self.spec.id, **self.env_kwargs)

    @staticmethod
    async def _call(env: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if _sync_only(env):  # a slow sync env runs in a thread, stalling nobody else
            return await asyncio.to_thread(getattr(env, name), *args, **kwargs)
        return await getattr(env, "a" + name)(*args, **kwargs)

    @staticmethod
    def _seed(data: dict[str, Any]) -> int | None:
        seed = data.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise ClientError(f"'seed' must be a non-negative integer or null, got {seed!r}")
        return seed

    @staticmethod
    def _action(data: Any) -> str | dict[str, Any]:
        if not isinstance(data, dict):
            raise ClientError("the action must be an object such as {\"text\": \"...\"}")
        if isinstance(data.get("text"), str):
            return data["text"]
        if isinstance(data.get("tool_call"), dict):
            return data["tool_call"]
        raise ClientError("the action needs a string 'text' field", code="VALIDATION_ERROR")

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
        return web.json_response({"status": "healthy"})

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

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ClientError(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ClientError("request body must be a JSON object")
        return body

    async def reset(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        env = await asyncio.to_thread(self._make)
        try:
            obs, info = await self._call(env, "reset", seed=self._seed(body))
            return web.json_response(self._observation(obs, None, False, False, info))
        finally:
            await asyncio.to_thread(env.close)

    async def step(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        action = self._action(body.get("action"))
        env = await asyncio.to_thread(self._make)
        try:  # OpenEnv's HTTP step is stateless: a fresh env, reset with the given seed, one step
            await self._call(env, "reset", seed=self._seed(body))
            obs, reward, terminated, truncated, info = await self._call(env, "step", action)
            return web.json_response(
                self._observation(obs, float(reward), bool(terminated or truncated), bool(truncated), info)
            )
        finally:
            await asyncio.to_thread(env.close)

    # -- WebSocket sessions -------------------------------------------------------------------
    async def _reap(self) -> None:
        now = time.monotonic()
        for sid, session in list(self.sessions.items()):
            if now - session.last_used > self.idle_timeout:
                self.sessions.pop(sid, None)
                await asyncio.to_thread(session.env.close)

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=30.0)
        await ws.prepare(request)
        await self._reap()
        if len(self.sessions) >= self.max_sessions:
            await ws.send_json(
                {
                    "type": "error",
                    "data": {
                        "message": f"the server holds its maximum of {self.max_sessions} sessions",
                        "code": "CAPACITY_REACHED",
                    },
                }
            )
            await ws.close()
            return ws
        sid = uuid.uuid4().hex
        try:
            session = self.sessions[sid] = _Session(env=await asyncio.to_thread(self._make))
        except Exception as exc:
            await ws.send_json(
                {"type": "error", "data": {"message": f"cannot make {self.spec.id}: {exc}", "code": "FACTORY_ERROR"}}
            )
            await ws.close()
            return ws
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    break
                session.last_used = time.monotonic()
                reply = await self._handle(session, message.data)
                if reply is None:
                    break
                await ws.send_json(reply)
        finally:
            self.sessions.pop(sid, None)
            await asyncio.to_thread(session.env.close)
            await ws.close()
        return ws

    async def _handle(self, session: _Session, raw: str) -> dict[str, Any] | None:
        """The reply to one client message; None for `close`."""
        try:
            message = json.loads(raw)
        except ValueError as exc:
            return {"type": "error", "data": {"message": f"Invalid JSON: {exc}", "code": "INVALID_JSON"}}
        if not isinstance(message, dict):
            return {"type": "error", "data": {"message": "a message must be a JSON object", "code": "VALIDATION_ERROR"}}
        kind, data = message.get("type"), message.get("data") or {}
        try:
            if kind == "reset":
                if not isinstance(data, dict):
                    raise ClientError("reset data must be an object")
                obs, info = await self._call(session.env, "reset", seed=self._seed(data))
                session.episode_id = str(data.get("episode_id") or uuid.uuid4().hex)[:128]
                session.step_count, session.done = 0, False
                return {"type": "observation", "data": self._observation(obs, None, False, False, info)}
            if kind == "step":
                if session.done:
                    raise ClientError(
                        "step before reset, or after the episode ended: send a reset first", code="EXECUTION_ERROR"
                    )
                obs, reward, terminated, truncated, info = await self._call(session.env, "step", self._action(data))
                session.step_count += 1
                session.done = bool(terminated or truncated)
                return {
                    "type": "observation",
                    "data": self._observation(obs, float(reward), session.done, bool(truncated), info),
                }
            if kind == "state":
                return {
                    "type": "state",
                    "data": {
                        "episode_id": session.episode_id,
                        "step_count": session.step_count,
                        "env_id": self.spec.id,
                    },
                }
            if kind == "close":
                return None
            return {"type": "error", "data": {"message": f"Unknown message type: {kind}", "code": "UNKNOWN_TYPE"}}
        except ClientError as exc:
            return {"type": "error", "data": {"message": str(exc), "code": exc.code}}
        except ResetNeeded as exc:
            session.done = True
            return {"type": "error", "data": {"message": str(exc), "code": "EXECUTION_ERROR"}}
        except Exception as exc:  # the env raised: the session survives, the client is told
            return {"type": "error", "data": {"message": f"{type(exc).__name__}: {exc}", "code": "EXECUTION_ERROR"}}


def serve(
    env_id: str,
    host: str,
    port: int,
    *,
    token: str | None = None,
    max_sessions: int | None = None,
    idle_timeout: float | None = None,
) -> None:
    """Run the OpenEnv-protocol server until interrupted."""
    limits = {k: v for k, v in (("max_sessions", max_sessions), ("idle_timeout", idle_timeout)) if v is not None}
    server = OpenEnvServer(env_id, token=token, **limits)
    print(
        f"envhub: serving {server.spec.id} in OpenEnv's protocol on http://{host}:{port} (/ws, /reset, /step, "
        f"/schema, /health)",
        flush=True,
    )
    try:
        web.run_app(server.app(), host=host, port=port, print=None, access_log=None)
    except OSError as exc:
        raise EnvhubError(
            f"cannot serve on {host}:{port}: {exc.strerror or exc}",
            hint="choose another --port, or stop what is using it",
        ) from None
