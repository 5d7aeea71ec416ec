"""`envhub serve`: the registered envs over HTTP (aiohttp, JSON), one env per session.

Endpoints: see ENDPOINTS (all JSON; errors are 4xx/5xx with {"error": ..., "hint": ...}).

Clients are hostile: what they may build is decided by the operator's `ServePolicy` (403 otherwise),
requests pass a `ClientGuard` (bearer token, per-client rate, body size and deadline), and each client
holds a bounded number of sessions. Sessions idle longer than `idle_timeout` seconds are closed by a
reaper task; past `max_sessions` new sessions get 429. Async envs are driven through `areset`/`astep`
on the server's loop; envs that implement only sync `reset`/`step` run in a worker thread, so a slow
one stalls nobody else; either is cut off after `step_timeout` (504, session closed).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from gymnasium import spaces

from envhub.errors import ConfigError, EnvhubError, EnvNotFound, ResetNeeded
from envhub.server.guard import ClientGuard, HTTPError, ServerLimits
from envhub.server.policy import PolicyRefused, ServePolicy
from envhub.wire import ENDPOINTS, json_safe

DEFAULT_IDLE_TIMEOUT = 600.0
DEFAULT_MAX_SESSIONS = 1024
CLIENT: Any = (
    web.RequestKey("client", str) if hasattr(web, "RequestKey") else "client"
)  # who sent it: a token index or an IP (older aiohttp: a str key)


@dataclass
class Session:
    """One env held for one client."""

    id: str
    env_id: str
    env: Any
    owner: str = ""
    last_used: float = field(default_factory=time.monotonic)
    needs_reset: bool = True
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _sync_only(env: Any) -> bool:
    """True for envs that implement only sync `step`: they run in a worker thread so that a slow
    one cannot stall the server's loop (async envs are awaited on it)."""
    from envhub.core import AgentEnv

    cls = type(env.unwrapped)
    if not issubclass(cls, AgentEnv):
        return True
    return cls.step is not AgentEnv.step and cls.astep is AgentEnv.astep


def space_json(space: Any) -> dict[str, Any]:
    """A description of a space that the client can rebuild text spaces from."""
    if isinstance(space, spaces.Text):
        return {"type": "Text", "min_length": space.min_length, "max_length": space.max_length}
    return {"type": type(space).__name__, "repr": repr(space)}


class EnvServer:
    """The session table and the request handlers."""

    def __init__(
        self,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        *,
        policy: ServePolicy | None = None,
        tokens: tuple[str, ...] | list[str] = (),
        limits: ServerLimits | None = None,
    ) -> None:
        self.idle_timeout = idle_timeout
        self.max_sessions = max_sessions
        self.policy = policy or ServePolicy()
        self.limits = limits or ServerLimits()
        self.guard = ClientGuard(tokens, self.limits)
        self.sessions: dict[str, Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        self.reaped = 0
        self.timed_out = 0
        self._creating: dict[str, int] = {}  # client -> sessions being built, counted against the limits

    def app(self) -> web.Application:
        """The aiohttp application serving this table."""
        app = web.Application(middlewares=[self._errors, self._guard], client_max_size=self.limits.max_body)
        app.router.add_get("/health", self.health)
        app.router.add_get("/envs", self.list_envs)
        app.router.add_get("/envs/{env_id}", self.env_info)
        app.router.add_post("/sessions", self.create)
        app.router.add_post("/sessions/{sid}/reset", self.reset)
        app.router.add_post("/sessions/{sid}/step", self.step)
        app.router.add_delete("/sessions/{sid}", self.delete)
        app.on_startup.append(self._start_reaper)
        app.on_cleanup.append(self._shutdown)
        return app

    # -- plumbing -----------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except HTTPError as exc:
            return web.json_response({"error": exc.error, "hint": exc.hint}, status=exc.status, headers=exc.headers)
        except PolicyRefused as exc:
            return web.json_response({"error": str(exc.args[0]), "hint": exc.hint}, status=exc.status)
        except web.HTTPException as exc:  # aiohttp's own 404/405 for unknown routes
            if exc.status < 400:
                raise
            listed = "; ".join(f"{method} {path}" for method, path, _, _ in ENDPOINTS)
            hint = f"endpoints: {listed} (`envhub serve --help` describes them)"
            return web.json_response(
                {"error": f"{exc.reason}: {request.method} {request.path}", "hint": hint}, status=exc.status
            )
        except Exception as exc:  # an env that crashed must not take the server down
            return web.json_response(
                {"error": f"{type(exc).__name__}: {exc}", "hint": "the environment raised; see the server log"},
                status=500,
            )

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/health":  # health stays open for load balancers and liveness probes
            request[CLIENT] = self.guard.client_of(request)
            self.guard.admit(request[CLIENT])
        return await handler(request)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        return await self.guard.read_json(request)

    def _session(self, request: web.Request) -> Session:
        sid = request.match_info["sid"]
        session = self.sessions.get(sid)
        if session is None or session.owner != request[CLIENT]:  # another client's session looks like a missing one
            raise HTTPError(
                404,
                f"unknown session {sid!r}",
                f"it was closed or reaped after {self.idle_timeout:g}s idle; create a new one with POST /sessions",
            )
        session.last_used = time.monotonic()
        return session

    async def _start_reaper(self, app: web.Application) -> None:
        self._reaper = asyncio.create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        period = max(0.05, min(self.idle_timeout / 4, 30.0))
        while True:
            await asyncio.sleep(period)
            await self.reap_idle()
            self.guard.forget_idle()

    async def reap_idle(self) -> int:
        """Close sessions idle longer than `idle_timeout`; returns how many were closed."""
        now = time.monotonic()
        idle = [s for s in self.sessions.values() if now - s.last_used > self.idle_timeout and not s.lock.locked()]
        for session in idle:
            await self._close(session)
        self.reaped += len(idle)
        return len(idle)

    async def _close(self, session: Session) -> None:
        self.sessions.pop(session.id, None)
        try:
            await asyncio.wait_for(session.env.aclose(), 60)
        except Exception:
            pass  # closing is best effort (and bounded); the session is gone either way

    async def _run_env(self, session: Session, call: str, *args: Any, **kwargs: Any) -> Any:
        """`env.reset`/`env.step` (sync ones in a thread), cut off after step_timeout: 504 and the session is closed."""
        env = session.env
        if _sync_only(env):
            work = asyncio.to_thread(getattr(env, call), *args, **kwargs)
        else:
            work = getattr(env, "a" + call)(*args, **kwargs)
        try:
            return await asyncio.wait_for(work, self.limits.step_timeout)
        except TimeoutError:
            self.timed_out += 1
            asyncio.get_running_loop().create_task(self._close(session))  # a stuck env may also be slow to close
            self.sessions.pop(session.id, None)
            raise HTTPError(
                504,
                f"{session.env_id} took longer than {self.limits.step_timeout:g}s to {call}; the session was closed",
                "create a new session; the operator sets the limit with --step-timeout",
            ) from None

    async def _shutdown(self, app: web.Application) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for session in list(self.sessions.values()):
            await self._close(session)

    # -- handlers -----------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "sessions": len(self.sessions), "max_sessions": self.max_sessions})

    @staticmethod
    def _spec_json(spec: Any) -> dict[str, Any]:
        return {
            "id": spec.id,
            "tags": list(spec.tags),
            "description": spec.description,
            "multiagent": spec.multiagent,
            "max_episode_steps": spec.max_episode_steps,
        }

    async def list_envs(self, request: web.Request) -> web.Response:
        from envhub.registry import list_envs

        served = [s for s in list_envs(tag=request.query.get("tag")) if self.policy.serves(s.id)]
        return web.json_response([self._spec_json(s) for s in served])

    async def env_info(self, request: web.Request) -> web.Response:
        env_spec = self._lookup(request.match_info["env_id"])
        if not self.policy.serves(env_spec.id):
            raise HTTPError(404, f"{env_spec.id} is not served by this server", "GET /envs lists the served envs")
        return web.json_response(self._spec_json(env_spec))

    def _lookup(self, env_id: Any) -> Any:
        from envhub.registry import spec

        if not isinstance(env_id, str) or not env_id:
            raise HTTPError(400, "missing or non-string 'env_id'", 'send {"env_id": "Name-v0", "kwargs": {...}}')
        try:
            return spec(env_id)
        except EnvNotFound as exc:
            raise HTTPError(404, str(exc.args[0]), exc.hint) from exc

    async def create(self, request: web.Request) -> web.Response:
        from envhub.registry import list_envs, make

        body = await self._body(request)
        env_spec = self._lookup(body.get("env_id"))
        if env_spec.multiagent:
            seat_id = env_spec.id.rsplit("-v", 1)[0] + "-SelfPlay-v0"
            registered = any(s.id == seat_id for s in list_envs())
            hint = (
                f"sessions play one seat: use {seat_id}"
                if registered
                else "multi-agent envs are played locally with envhub.make_multiagent"
            )
            raise HTTPError(400, f"{env_spec.id} is a multi-agent environment", hint)
        kwargs = body.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise HTTPError(400, "'kwargs' must be a JSON object", 'e.g. {"kwargs": {"size": 6}}')
        client = request[CLIENT]
        if len(self.sessions) + sum(self._creating.values()) >= self.max_sessions:
            raise HTTPError(
                429,
                f"the server holds its maximum of {self.max_sessions} sessions",
                "close finished sessions (DELETE /sessions/{id}) or retry later",
            )
        held = sum(1 for s in self.sessions.values() if s.owner == client) + self._creating.get(client, 0)
        if held >= self.limits.sessions_per_client:
            raise HTTPError(
                429,
                f"this client holds its maximum of {self.limits.sessions_per_client} sessions",
                "close finished sessions (DELETE /sessions/{id}); the operator sets --sessions-per-client",
            )
        self.policy.options_for(env_spec.id, body.get("options"))  # refuse bad options before building anything
        self._creating[client] = (
            self._creating.get(client, 0) + 1
        )  # counted against the limits while the env is being built
        try:
            allowed = await asyncio.to_thread(self.policy.kwargs_for, env_spec, kwargs)
            env = await asyncio.to_thread(make, env_spec.id, **allowed)
        except PolicyRefused:
            raise
        except (TypeError, ValueError, EnvhubError) as exc:
            raise HTTPError(
                400,
                f"cannot make {env_spec.id} with kwargs {json.dumps(json_safe(kwargs))[:300]}: {exc}",
                f"`envhub info {env_spec.id}` lists its kwargs",
            ) from exc
        finally:
            self._creating[client] -= 1
            if not self._creating[client]:
                del self._creating[client]
        session = Session(id=uuid.uuid4().hex, env_id=env_spec.id, env=env, owner=client)
        self.sessions[session.id] = session
        reply: dict[str, Any] = {
            "session_id": session.id,
            "env_id": env_spec.id,
            "observation_space": space_json(env.observation_space),
            "action_space": space_json(env.action_space),
            "idle_timeout": self.idle_timeout,
        }
        if body.get("reset"):
            try:
                reply.update(await self._reset(session, body))
            except BaseException:
                await self._close(session)  # the client never learns this id, so do not keep it
                raise
        return web.json_response(reply)

    async def _reset(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64):
            raise HTTPError(400, f"'seed' must be an integer in [0, 2**64) or null, got {str(seed)[:40]}")
        options = self.policy.options_for(session.env_id, body.get("options"))
        async with session.lock:
            try:
                obs, info = await self._run_env(session, "reset", seed=seed, options=options)
            except ConfigError as exc:  # e.g. an options value the env does not know
                raise HTTPError(400, f"cannot reset {session.env_id}: {exc.args[0]}", exc.hint) from exc
            session.needs_reset = False
        session.last_used = time.monotonic()
        return {"observation": json_safe(obs), "info": json_safe(info)}

    async def reset(self, request: web.Request) -> web.Response:
        session = self._session(request)
        return web.json_response(await self._reset(session, await self._body(request)))

    async def step(self, request: web.Request) -> web.Response:
        session = self._session(request)
        body = await self._body(request)
        if "action" not in body:
            raise HTTPError(400, "missing 'action'", 'send {"action": "your text"}')
        action = body["action"]
        if not isinstance(action, (str, dict)):
            raise HTTPError(400, f"'action' must be a string or an object, got {type(action).__name__}")
        size = len(action) if isinstance(action, str) else len(json.dumps(action))
        if size > self.limits.max_action_chars:
            raise HTTPError(
                413,
                f"action is {size} characters, over this server's limit of {self.limits.max_action_chars}",
                "send a shorter action; the operator sets --max-action-chars",
            )
        if session.needs_reset:
            raise HTTPError(
                409,
                "step before reset: the episode has not started or has ended",
                f"POST /sessions/{session.id}/reset first",
            )
        async with session.lock:
            try:
                obs, reward, terminated, truncated, info = await self._run_env(session, "step", action)
            except ResetNeeded as exc:
                session.needs_reset = True
                raise HTTPError(409, str(exc.args[0]), exc.hint or "reset the session") from exc
            session.needs_reset = bool(terminated or truncated)
        session.last_used = time.monotonic()
        return web.json_response(
            {
                "observation": json_safe(obs),
                "reward": json_safe(float(reward)),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": json_safe(info),
            }
        )

    async def delete(self, request: web.Request) -> web.Response:
        session = self._session(request)
        async with session.lock:
            await self._close(session)
        return web.json_response({"closed": session.id})
