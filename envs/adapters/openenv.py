"""`OpenEnvEnv`: any OpenEnv server (HTTP + WebSocket env server) as an envhub `AgentEnv`.

OpenEnv's session protocol, as its `openenv-core` server speaks it: one WebSocket per session at
`/ws`; the client sends `{"type": "reset", "data": {...}}`, `{"type": "step", "data": action}`,
`{"type": "state"}`, `{"type": "close"}`; the server answers `{"type": "observation", "data":
{"observation": {...}, "reward": r | null, "done": bool}}`, `{"type": "state", "data": {...}}` or
`{"type": "error", "data": {"message", "code"}}`. `GET /schema` gives the JSON schemas of action,
observation and state; `GET /health` answers `{"status": "healthy"}`.

Mapping: the observation is the text field of OpenEnv's observation (the only string field, or
one named text/prompt/message/...), else the observation as JSON; the whole dict is in
`info["openenv_observation"]`. An action string that is a JSON object is sent as the action;
any other string fills the action schema's string field (the required one, else the first).
Reward `null` counts as 0; `done` is `terminated`. Each reset opens a fresh session (WebSocket).
Speaks the protocol with aiohttp, so it needs no OpenEnv package; registered as `OpenEnv-v0`
(`envhub.make("OpenEnv-v0", url=...)`) so `envhub train` configs can name it.

No anchor (`info["anchor"]`, docs/authoring.md): the env's state lives in the server, and OpenEnv's `state` message
returns an episode id and a step count plus whatever fields the server adds, so it names no state exactly; the
trainer hashes the observation instead.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import TYPE_CHECKING, Any, ClassVar

from envhub.core import AgentEnv, UnicodeText
from envhub.errors import ResetNeeded
from envhub.remote import RemoteError

if TYPE_CHECKING:
    import aiohttp

TEXT_FIELDS = ("text", "prompt", "message", "content", "output", "echoed_message", "observation", "stdout")


def observation_text(observation: dict[str, Any]) -> str:
    """The text a model reads from an OpenEnv observation dict."""
    strings = {k: v for k, v in observation.items() if isinstance(v, str)}
    for name in TEXT_FIELDS:
        if strings.get(name):
            return strings[name]
    if len(strings) == 1:
        return next(iter(strings.values()))
    return json.dumps(observation, sort_keys=True, default=str)


def action_field(schema: dict[str, Any]) -> str | None:
    """The string field of an OpenEnv action schema a plain-text action fills."""
    properties = schema.get("properties", {})
    strings = [k for k, v in properties.items() if v.get("type") == "string"]
    required = [k for k in schema.get("required", []) if k in strings]
    return (required or strings or [None])[0]


class OpenEnvEnv(AgentEnv):
    """The env served by the OpenEnv server at `url`, one WebSocket session per episode."""

    system_prompt: ClassVar[str] = "Act in the environment; reply with the action it asks for."
    reward_doc: ClassVar[str] = "the OpenEnv server's reward (null counts as 0)"

    def __init__(
        self,
        url: str,
        *,
        reset_kwargs: dict[str, Any] | None = None,
        request_timeout: float = 120.0,
        render_mode: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.reset_kwargs = dict(reset_kwargs or {})
        self.request_timeout = request_timeout
        self.render_mode = render_mode
        self.observation_space = UnicodeText()
        self.action_space = UnicodeText()
        self.schema: dict[str, Any] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._last = ""
        self._done = True

    # -- protocol -----------------------------------------------------------------------------
    async def _client(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._http is None or self._http.closed or self._http._loop is not asyncio.get_running_loop():
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.request_timeout))
        return self._http

    async def _get(self, path: str) -> dict[str, Any]:
        import aiohttp

        try:
            async with (await self._client()).get(self.url + path) as reply:
                if reply.status >= 400:
                    raise RemoteError(
                        f"OpenEnv server at {self.url} refused GET {path} ({reply.status}): "
                        f"{(await reply.text())[:300]}"
                    )
                return await reply.json()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise RemoteError(
                f"OpenEnv server at {self.url} cannot be reached: {type(exc).__name__}: {exc}",
                hint="check that the server runs and the URL is right",
            ) from None

    async def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        assert self._ws is not None
        try:
            await self._ws.send_str(json.dumps(message))
            reply = await self._ws.receive(timeout=self.request_timeout)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            raise RemoteError(
                f"OpenEnv session at {self.url}/ws stopped answering: {type(exc).__name__}: {exc}",
                hint="the server may have restarted; reset() opens a new session",
            ) from None
        if reply.type != aiohttp.WSMsgType.TEXT:
            raise RemoteError(
                f"OpenEnv session at {self.url}/ws closed ({reply.type.name}) during {message['type']}",
                hint="reset() opens a new session",
            )
        body = json.loads(reply.data)
        if body.get("type") == "error":
            data = body.get("data", {})
            raise RemoteError(
                f"OpenEnv server at {self.url} refused {message['type']}: {data.get('message', data)}",
                hint=f"error code {data.get('code', '?')}",
            )
        return body.get("data", {})

    async def _close_session(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None and not ws.closed:
            try:
                await ws.send_str(json.dumps({"type": "close"}))
            except Exception:
                pass  # the server reaps a session whose socket is gone
            await ws.close()

    # -- AgentEnv -----------------------------------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        import aiohttp

        await super().areset(seed=seed)
        await self._close_session()
        if self.schema is None:
            self.schema = await self._get("/schema")
        ws_url = self.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/ws"
        try:
            self._ws = await (await self._client()).ws_connect(ws_url, max_msg_size=64 * 1024 * 1024)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise RemoteError(
                f"cannot open an OpenEnv session at {ws_url}: {type(exc).__name__}: {exc}",
                hint="check that the server runs and speaks OpenEnv's /ws protocol",
            ) from None
        data = {**self.reset_kwargs, **(options or {})}
        if seed is not None:
            data["seed"] = seed
        result = await self._exchange({"type": "reset", "data": data})
        observation = result.get("observation", {})
        self._last = observation_text(observation)
        self._done = bool(result.get("done", False))
        return self._last, self.base_info(
            openenv_observation=observation, action_schema=copy.deepcopy(self.schema.get("action", {}))
        )

    async def astep(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._ws is None or self._done:
            raise ResetNeeded(f"step() without an open episode on {self.url}", hint="call reset() first")
        result = await self._exchange({"type": "step", "data": self._payload(action)})
        observation = result.get("observation", {})
        self._last = observation_text(observation)
        self._done = bool(result.get("done", False))
        reward = result.get("reward")
        return self._last, float(reward or 0.0), self._done, False, {"openenv_observation": observation}

    def _payload(self, action: str | dict[str, Any]) -> dict[str, Any]:
        if isinstance(action, dict):
            return (
                dict(action.get("arguments", action))
                if isinstance(action.get("arguments", action), dict)
                else {"arguments": action}
            )
        stripped = action.strip()
        if stripped.startswith("{"):
            try:
                parsed = json.loads(stripped)
                if isinstance(parsed, dict):
                    return parsed
            except ValueError:
                pass  # not JSON: a plain text action
        field = action_field((self.schema or {}).get("action", {})) or "message"
        return {field: action}

    async def state(self) -> dict[str, Any]:
        """The server's `state` of the open session."""
        if self._ws is None:
            raise ResetNeeded("no open OpenEnv session", hint="call reset() first")
        return await self._exchange({"type": "state"})

    async def health(self) -> dict[str, Any]:
        """The server's `/health` reply."""
        return await self._get("/health")

    async def aclose(self) -> None:
        await self._close_session()
        if self._http is not None:
            await self._http.close()
            self._http = None

    def render_text(self) -> str:
        return self._last


def register_envs() -> None:
    """Entry point: `OpenEnv-v0` builds an `OpenEnvEnv` (pass `url=`), so configs can name OpenEnv servers."""
    from envhub.registry import register

    register(
        "OpenEnv-v0",
        "envhub.envs.adapters.openenv:OpenEnvEnv",
        tags=("openenv", "remote", "single-agent"),
        description="Any OpenEnv server: envhub.make('OpenEnv-v0', url='http://host:port')",
        source="openenv-protocol",
    )
