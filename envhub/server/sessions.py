"""The session table both env servers keep: who holds which env, how many at once, for how long, and how env calls run.

Sessions count against a server-wide cap (`max_sessions`) and a per-client cap
(`ServerLimits.sessions_per_client`); both count sessions whose env is still being built, so a burst
of creations cannot overshoot them. A reaper task closes sessions idle longer than `idle_timeout`
(never one in the middle of an env call). `SessionTable.run` makes env calls: async envs are awaited
on the server's loop, envs that implement only sync `reset`/`step` run in a worker thread (a slow one
stalls nobody else); either is cut off after `ServerLimits.step_timeout` (504, and the session is closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from envhub.server.guard import HTTPError, ServerLimits

DEFAULT_IDLE_TIMEOUT = 600.0
DEFAULT_MAX_SESSIONS = 1024
CLOSE_TIMEOUT = 60.0  # seconds a session's env (or transport) may take to close


@dataclass
class Session:
    """One env held for one client."""

    id: str
    env_id: str
    env: Any
    owner: str = ""
    last_used: float = field(default_factory=time.monotonic)
    needs_reset: bool = True
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  #: held during env calls; the reaper skips held ones
    on_close: Callable[[], Awaitable[Any]] | None = None  #: ends the transport (a WebSocket) when the table closes it


def sync_only(env: Any) -> bool:
    """True for envs that implement only sync `step`: they run in a worker thread so that a slow
    one cannot stall the server's loop (async envs are awaited on it)."""
    from envhub.core import AgentEnv

    cls = type(env.unwrapped)
    if not issubclass(cls, AgentEnv):
        return True
    return cls.step is not AgentEnv.step and cls.astep is AgentEnv.astep


class SessionTable:
    """The sessions of one server, their caps, their reaper and their env calls."""

    def __init__(
        self,
        limits: ServerLimits,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        on_sweep: Callable[[], None] | None = None,
    ) -> None:
        self.limits = limits
        self.idle_timeout = idle_timeout
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self.reaped = 0  #: sessions closed for idling
        self.timed_out = 0  #: env calls cut off after step_timeout
        self._on_sweep = on_sweep  # also run on every reaper pass (the guard forgets idle clients)
        self._creating: dict[str, int] = {}  # client -> sessions being built, counted against the caps
        self._reaper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[Any]] = set()  # closes not awaited by their caller, kept referenced

    def counters(self) -> dict[str, Any]:
        """What /health reports: sessions held, the cap, sessions reaped and env calls timed out."""
        return {
            "sessions": len(self.sessions),
            "max_sessions": self.max_sessions,
            "reaped": self.reaped,
            "timed_out": self.timed_out,
        }

    def get(self, sid: str, client: str) -> Session | None:
        """The client's session `sid` (None when unknown or another client's), marked as just used."""
        session = self.sessions.get(sid)
        if session is None or session.owner != client:
            return None
        session.last_used = time.monotonic()
        return session

    @contextlib.contextmanager
    def reserve(self, client: str) -> Iterator[None]:
        """Hold one of the client's session slots while its env is built; 429 when the server or client is full."""
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
        self._creating[client] = self._creating.get(client, 0) + 1
        try:
            yield
        finally:
            self._creating[client] -= 1
            if not self._creating[client]:
                del self._creating[client]

    def add(self, env_id: str, env: Any, client: str) -> Session:
        """Register a built env as the client's new session (call right after `reserve`'s block)."""
        session = Session(id=uuid.uuid4().hex, env_id=env_id, env=env, owner=client)
        self.sessions[session.id] = session
        return session

    async def open(self, client: str, env_id: str, build: Callable[[], Any]) -> Session:
        """A new session for the client, its env built by `build()` in a worker thread, within the caps."""
        with self.reserve(client):
            env = await asyncio.to_thread(build)
        return self.add(env_id, env, client)

    async def close(self, session: Session) -> None:
        """Remove the session and close its env and transport (best effort, bounded); closing twice is a no-op."""
        if self.sessions.pop(session.id, None) is None:
            return
        await self._close_env(session)
        if session.on_close is not None:  # in the background: a WebSocket waits for its client's close reply
            self._in_background(self._bounded(session.on_close()))

    def _in_background(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    async def _bounded(work: Awaitable[Any]) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(work, CLOSE_TIMEOUT)

    @classmethod
    async def _close_env(cls, session: Session) -> None:
        await cls._bounded(session.env.aclose())  # best effort; the session is gone either way

    async def reap_idle(self) -> int:
        """Close sessions idle longer than `idle_timeout`; returns how many were closed."""
        now = time.monotonic()
        idle = [s for s in self.sessions.values() if now - s.last_used > self.idle_timeout and not s.lock.locked()]
        for session in idle:
            await self.close(session)
        self.reaped += len(idle)
        return len(idle)

    async def run(self, session: Session, call: str, *args: Any, **kwargs: Any) -> Any:
        """`env.reset`/`env.step` (sync ones in a thread), cut off after step_timeout: 504 and the session is closed."""
        env = session.env
        if sync_only(env):
            work = asyncio.to_thread(getattr(env, call), *args, **kwargs)
        else:
            work = getattr(env, "a" + call)(*args, **kwargs)
        try:
            return await asyncio.wait_for(work, self.limits.step_timeout)
        except TimeoutError:
            self.timed_out += 1
            if self.sessions.pop(session.id, None) is not None:  # gone now; a stuck env may also be slow to close
                self._in_background(self._close_env(session))
            raise HTTPError(
                504,
                f"{session.env_id} took longer than {self.limits.step_timeout:g}s to {call}; the session was closed",
                "create a new session; the operator sets the limit with --step-timeout",
            ) from None
        finally:  # idle time starts when the env is done: a step longer than idle_timeout is busy, not idle
            session.last_used = time.monotonic()

    async def start(self, app: Any = None) -> None:
        """Start the reaper (an aiohttp on_startup hook)."""
        self._reaper = asyncio.create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        period = max(0.05, min(self.idle_timeout / 4, 30.0))
        while True:
            await asyncio.sleep(period)
            await self.reap_idle()
            if self._on_sweep is not None:
                self._on_sweep()

    async def stop(self, app: Any = None) -> None:
        """Stop the reaper and close every session (an aiohttp shutdown hook)."""
        if self._reaper is not None:
            self._reaper.cancel()
        for session in list(self.sessions.values()):
            await self.close(session)
        await asyncio.gather(*self._background, return_exceptions=True)  # each is bounded by CLOSE_TIMEOUT
