"""`envhub serve`: the registered envs over HTTP (aiohttp, JSON), one env per session.

Endpoints: see ENDPOINTS (all JSON; errors are 4xx/5xx with {"error": ..., "hint": ...}).

Clients are hostile: what they may build is decided by the operator's `ServePolicy` (403 otherwise),
requests pass the `ClientGuard` (bearer token, per-client rate, body size and deadline), and sessions
live in a `SessionTable` (per-client and server caps, 429 above; idle reaping; env calls cut off after
`step_timeout`, 504) - the same guard and table as the OpenEnv-protocol server's.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web
from gymnasium import spaces

from envhub.errors import ConfigError, EnvhubError, EnvNotFound, ResetNeeded
from envhub.server.guard import CLIENT, ClientGuard, HTTPError, ServerLimits, check_seed
from envhub.server.policy import PolicyRefused, ServePolicy
from envhub.server.sessions import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_SESSIONS, Session, SessionTable
from envhub.wire import ENDPOINTS, json_safe

MAX_CACHED_LISTINGS = 64


def space_json(space: Any) -> dict[str, Any]:
    """A description of a space that the client can rebuild text spaces from."""
    if isinstance(space, spaces.Text):
        return {"type": "Text", "min_length": space.min_length, "max_length": space.max_length}
    return {"type": type(space).__name__, "repr": repr(space)}


class EnvServer:
    """The envhub protocol's request handlers over one guard and one session table."""

    def __init__(
        self,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        *,
        policy: ServePolicy | None = None,
        tokens: tuple[str, ...] | list[str] = (),
        limits: ServerLimits | None = None,
    ) -> None:
        self.policy = policy or ServePolicy()
        self.limits = limits or ServerLimits()
        self.guard = ClientGuard(tokens, self.limits)
        self.table = SessionTable(self.limits, idle_timeout, max_sessions, on_sweep=self.guard.forget_idle)
        self._listings: dict[tuple[str | None, int], bytes] = {}  # GET /envs answers by (tag, registry size)

    @property
    def sessions(self) -> dict[str, Session]:
        """The open sessions by id."""
        return self.table.sessions

    @property
    def idle_timeout(self) -> float:
        return self.table.idle_timeout

    @property
    def reaped(self) -> int:
        return self.table.reaped

    def app(self) -> web.Application:
        """The aiohttp application serving this table."""
        app = web.Application(middlewares=[self._errors, self.guard.middleware], client_max_size=self.limits.max_body)
        app.router.add_get("/health", self.health)
        app.router.add_get("/envs", self.list_envs)
        app.router.add_get("/envs/{env_id}", self.env_info)
        app.router.add_post("/sessions", self.create)
        app.router.add_post("/sessions/{sid}/reset", self.reset)
        app.router.add_post("/sessions/{sid}/step", self.step)
        app.router.add_delete("/sessions/{sid}", self.delete)
        app.on_startup.append(self.table.start)
        app.on_cleanup.append(self.table.stop)
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

    async def _body(self, request: web.Request) -> dict[str, Any]:
        return await self.guard.read_json(request)

    def _session(self, request: web.Request) -> Session:
        sid = request.match_info["sid"]
        session = self.table.get(sid, request[CLIENT])
        if session is None:  # another client's session looks like a missing one
            raise HTTPError(
                404,
                f"unknown session {sid!r}",
                f"it was closed or reaped after {self.idle_timeout:g}s idle; create a new one with POST /sessions",
            )
        return session

    async def reap_idle(self) -> int:
        """Close sessions idle longer than `idle_timeout`; returns how many were closed."""
        return await self.table.reap_idle()

    # -- handlers -----------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **self.table.counters()})

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
        return web.Response(body=self._listing(request.query.get("tag")), content_type="application/json")

    def _listing(self, tag: str | None) -> bytes:
        """GET /envs as JSON bytes, built once per tag and registry size: a thousand envs are ~200 KB, and a client
        within its rate limit must not keep the server busy re-encoding them (found by benchmarks/server_soak.py)."""
        from envhub.registry import list_envs

        specs = list_envs(tag=tag)
        key = (tag, len(specs))
        if key not in self._listings:
            if len(self._listings) >= MAX_CACHED_LISTINGS:  # tags are the client's: the cache stays bounded
                self._listings.clear()
            served = [s for s in specs if self.policy.serves(s.id)]
            self._listings[key] = json.dumps([self._spec_json(s) for s in served]).encode()
        return self._listings[key]

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
        body = await self._body(request)
        env_spec = self._lookup(body.get("env_id"))
        self._refuse_multiagent(env_spec)
        kwargs = body.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise HTTPError(400, "'kwargs' must be a JSON object", 'e.g. {"kwargs": {"size": 6}}')
        with self.table.reserve(request[CLIENT]):  # counted against the caps while the env is being built
            self.policy.options_for(env_spec.id, body.get("options"))  # refuse bad options before building anything
            env = await self._make(env_spec, kwargs)
        session = self.table.add(env_spec.id, env, request[CLIENT])
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
                await self.table.close(session)  # the client never learns this id, so do not keep it
                raise
        return web.json_response(reply)

    @staticmethod
    def _refuse_multiagent(env_spec: Any) -> None:
        from envhub.registry import list_envs

        if not env_spec.multiagent:
            return
        seat_id = env_spec.id.rsplit("-v", 1)[0] + "-SelfPlay-v0"
        registered = any(s.id == seat_id for s in list_envs())
        hint = (
            f"sessions play one seat: use {seat_id}"
            if registered
            else "multi-agent envs are played locally with envhub.make_multiagent"
        )
        raise HTTPError(400, f"{env_spec.id} is a multi-agent environment", hint)

    async def _make(self, env_spec: Any, kwargs: dict[str, Any]) -> Any:
        """The env built with the kwargs the policy allows this client (PolicyRefused or 400 otherwise)."""
        from envhub.registry import make

        try:
            allowed = await asyncio.to_thread(self.policy.kwargs_for, env_spec, kwargs)
            return await asyncio.to_thread(make, env_spec.id, **allowed)
        except PolicyRefused:
            raise
        except (TypeError, ValueError, EnvhubError) as exc:
            raise HTTPError(
                400,
                f"cannot make {env_spec.id} with kwargs {json.dumps(json_safe(kwargs))[:300]}: {exc}",
                f"`envhub info {env_spec.id}` lists its kwargs",
            ) from exc

    async def _reset(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        seed = check_seed(body.get("seed"))
        options = self.policy.options_for(session.env_id, body.get("options"))
        async with session.lock:
            try:
                obs, info = await self.table.run(session, "reset", seed=seed, options=options)
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
        action = self.guard.check_action(body["action"])
        if session.needs_reset:
            raise HTTPError(
                409,
                "step before reset: the episode has not started or has ended",
                f"POST /sessions/{session.id}/reset first",
            )
        async with session.lock:
            try:
                obs, reward, terminated, truncated, info = await self.table.run(session, "step", action)
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
            await self.table.close(session)
        return web.json_response({"closed": session.id})
