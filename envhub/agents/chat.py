"""`ChatAgent`: an agent backed by any OpenAI-compatible chat endpoint (vLLM, SGLang, OpenAI, serve-engine).

Tools: with `tool_mode="auto"` the env's tools (`info["tools"]`) are sent as native `tools`; a server that
rejects them (HTTP 400 naming tools) is remembered and the agent switches to text tool calls, listing the
tool schemas in the system prompt and letting the env parse `<tool_call>{...}</tool_call>` from the reply.

Context window: the conversation is kept under `context_chars` characters (about 4 characters a token).
The system prompt and the first observation (the task) always stay; the oldest later turns are dropped
whole (an assistant message with the observations that answered it) and the first observation gets the
marker "[N earlier turns were removed to fit the context window]". A server's context-length error
halves the budget and retries, twice at most.

Failures: 429, 5xx and connection errors are retried with exponential backoff and full jitter
(`Retry-After` honoured, capped); 401/403, other 4xx, and retries running out raise `AgentError` with a
`kind` (auth, rate_limit, server, unreachable, context_length, not_found, bad_request).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

from envhub.agents.base import Action, Agent, AgentError

TOOL_MODES = ("auto", "native", "text")
CONTEXT_MARKER = "[{n} earlier turns were removed to fit the context window]"
_CONTEXT_WORDS = (
    "context length",
    "context_length",
    "context window",
    "maximum context",
    "too many tokens",
    "prompt is too long",
)


@dataclass
class ChatEndpoint:
    """One OpenAI-compatible endpoint shared by every episode's agent: the client and what was learned about it."""

    base_url: str
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 120.0
    native_tools: bool | None = None  # None until a request with tools succeeds or is refused
    _client: Any = None
    _model_lock: asyncio.Lock | None = field(default=None, repr=False)

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                from openai import AsyncOpenAI
            except ImportError as exc:
                raise AgentError(
                    "config", "the openai package is not installed", hint="pip install 'envhub[eval]'"
                ) from exc
            key = self.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
            # retries are ours (backoff with jitter, counted per episode), not the client's
            self._client = AsyncOpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=self.timeout_s)
        return self._client

    async def resolve_model(self) -> str:
        """The model to ask for: the one given, else the first the server lists at /v1/models."""
        if self.model:
            return self.model
        self._model_lock = self._model_lock or asyncio.Lock()
        async with self._model_lock:
            if not self.model:
                page = await self.client.models.list()
                ids = [m.id for m in page.data]
                if not ids:
                    raise AgentError(
                        "not_found", f"{self.base_url}/models lists no model", hint="name one: openai:URL#MODEL"
                    )
                self.model = ids[0]
        return self.model

    async def aclose(self) -> None:
        """Close the HTTP client (a later request opens a new one)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def __aenter__(self) -> ChatEndpoint:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class ChatAgent(Agent):
    """Acts by asking an OpenAI-compatible chat endpoint, one request per step."""

    name = "chat"

    def __init__(
        self,
        base_url: str | ChatEndpoint,
        model: str | None = None,
        api_key: str | None = None,
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        tool_mode: str = "auto",
        context_chars: int = 32_000,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        timeout_s: float = 120.0,
    ) -> None:
        if tool_mode not in TOOL_MODES:
            raise AgentError("config", f"unknown tool_mode {tool_mode!r}", hint=f"use one of {', '.join(TOOL_MODES)}")
        # an endpoint passed in is shared with other agents (its owner closes it); one made here is this agent's
        self._owns_endpoint = not isinstance(base_url, ChatEndpoint)
        self.endpoint = (
            base_url
            if isinstance(base_url, ChatEndpoint)
            else ChatEndpoint(normalize_base_url(base_url), model, api_key, timeout_s)
        )
        self.temperature, self.max_tokens, self.tool_mode = temperature, max_tokens, tool_mode
        self.context_chars, self.max_retries = context_chars, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.retries = 0  # requests retried in this episode (429/5xx/connection)
        self.dropped_turns = 0
        self.reset({})

    def reset(self, info: dict[str, Any]) -> None:
        self.system_prompt = str(info.get("system_prompt") or "")
        self.tools: list[dict[str, Any]] = list(info.get("tools") or [])
        self.seed = info.get("agent_seed")
        self.task: str | None = None  # the first observation: never dropped
        self.turns: list[list[dict[str, Any]]] = []  # each: assistant message, then the observations answering it
        self.pending_call_ids: list[str] = []
        self.budget = self.context_chars
        self.retries = self.dropped_turns = 0

    async def act(self, observation: str, info: dict[str, Any]) -> Action:
        self._add_observation(observation)
        message = await self._complete()
        content = message.content or ""
        calls = [_call_dict(c) for c in (message.tool_calls or [])]
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": content,
        }  # "" not None: many servers' templates read it
        if calls:
            assistant["tool_calls"] = calls
        self.turns.append([assistant])
        self.pending_call_ids = [c["id"] for c in calls]
        # envs run one tool call per step: hand over the first, tell the model about the rest next turn
        return {"content": content, "tool_calls": calls[:1]} if calls else content

    # -- conversation ---------------------------------------------------------------------------
    def _add_observation(self, observation: str) -> None:
        if self.task is None:
            self.task = observation
            return
        if self.pending_call_ids and not self._text_tools():
            first, *rest = self.pending_call_ids
            replies = [{"role": "tool", "tool_call_id": first, "content": observation}]
            replies += [
                {"role": "tool", "tool_call_id": i, "content": "Not run: make one tool call per step."} for i in rest
            ]
        else:
            replies = [{"role": "user", "content": observation}]
        self.turns[-1].extend(replies)
        self.pending_call_ids = []

    def messages(self) -> list[dict[str, Any]]:
        """The request's messages: head, then the newest turns that fit the budget (oldest dropped, marked)."""
        system = self.system_prompt + (self._text_tools_prompt() if self._text_tools() else "")
        head = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": self.task or ""}
        ]
        size = sum(map(_chars, head))
        kept: list[list[dict[str, Any]]] = []
        for turn in reversed(self.turns):
            turn_size = sum(map(_chars, turn))
            if kept and size + turn_size > self.budget:
                break
            kept.insert(0, turn)
            size += turn_size
        dropped = len(self.turns) - len(kept)
        self.dropped_turns = max(self.dropped_turns, dropped)
        if dropped:
            head[-1]["content"] = f"{head[-1]['content']}\n\n{CONTEXT_MARKER.format(n=dropped)}"
        if self._text_tools():  # a refused native request may have left tool messages in the history
            kept = [[_as_text_message(m) for m in turn] for turn in kept]
        return head + [m for turn in kept for m in turn]

    def _text_tools(self) -> bool:
        return bool(self.tools) and (
            self.tool_mode == "text" or (self.tool_mode == "auto" and self.endpoint.native_tools is False)
        )

    def _text_tools_prompt(self) -> str:
        schemas = "\n".join(json.dumps(t) for t in self.tools)
        return (
            "\n\n# Tools\nYou may call these tools (JSON schemas):\n" + schemas + "\n"
            'Call one by writing <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> in your reply.'
        )

    # -- requests -------------------------------------------------------------------------------
    async def _complete(self) -> Any:
        import openai

        model = await self._with_retries(self.endpoint.resolve_model)
        context_retries = 0
        while True:
            native = bool(self.tools) and not self._text_tools()
            request: dict[str, Any] = {
                "model": model,
                "messages": self.messages(),
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
            }
            if native:
                request["tools"] = self.tools
            if self.seed is not None:
                request["seed"] = int(self.seed) % 2**31
            try:
                response = await self._with_retries(lambda r=request: self.endpoint.client.chat.completions.create(**r))
            except openai.BadRequestError as exc:
                text = _error_text(exc)
                if any(w in text.lower() for w in _CONTEXT_WORDS):
                    context_retries += 1
                    if context_retries > 2:
                        raise AgentError(
                            "context_length", f"the conversation does not fit the model's context window: {text}"
                        ) from None
                    self.budget = max(1, min(self.budget, sum(map(_chars, self.messages()))) // 2)
                    continue
                if native and self.tool_mode == "auto" and "tool" in text.lower():
                    self.endpoint.native_tools = False  # this server does not take `tools`: write them in the prompt
                    continue
                raise AgentError("bad_request", f"the endpoint rejected the request (400): {text}") from None
            if native:
                self.endpoint.native_tools = True
            if not response.choices:
                raise AgentError("server", "the endpoint returned no choices")
            return response.choices[0].message

    async def _with_retries(self, request: Any) -> Any:
        import openai

        for attempt in range(self.max_retries + 1):
            try:
                return await request()
            except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
                raise AgentError(
                    "auth",
                    f"the endpoint refused the API key ({exc.status_code}): {_error_text(exc)}",
                    hint="pass --api-key or set OPENAI_API_KEY",
                ) from None
            except openai.NotFoundError as exc:
                raise AgentError(
                    "not_found",
                    f"not found (404) at {self.endpoint.base_url}: {_error_text(exc)}",
                    hint="check the URL (it usually ends in /v1) and the model name",
                ) from None
            except (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError) as exc:
                if attempt == self.max_retries:
                    raise _final_error(exc, self.endpoint.base_url, attempt + 1) from None
                self.retries += 1
                await asyncio.sleep(self._delay(attempt, exc))
            except openai.APIStatusError as exc:
                if exc.status_code >= 500:  # 5xx that the client did not map to InternalServerError
                    if attempt == self.max_retries:
                        raise _final_error(exc, self.endpoint.base_url, attempt + 1) from None
                    self.retries += 1
                    await asyncio.sleep(self._delay(attempt, exc))
                    continue
                if exc.status_code == 400:
                    raise
                raise AgentError(
                    "bad_request", f"the endpoint answered {exc.status_code}: {_error_text(exc)}"
                ) from None
        raise AssertionError("unreachable")

    def _delay(self, attempt: int, exc: Exception) -> float:
        """Exponential backoff with full jitter; a server's Retry-After wins when it says more."""
        delay = random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2**attempt))
        response = getattr(exc, "response", None)
        retry_after = response.headers.get("retry-after") if response is not None else None
        try:
            return min(self.max_backoff_s, max(delay, float(retry_after))) if retry_after else delay
        except ValueError:
            return delay

    async def aclose(self) -> None:
        """Close the endpoint's client if this agent made the endpoint; a shared endpoint stays open for the others
        (its owner, e.g. `envhub.cli.agent_spec.AgentFactory`, closes it)."""
        if self._owns_endpoint:
            await self.endpoint.aclose()


def normalize_base_url(url: str) -> str:
    """The endpoint's base URL; a bare host (no path) gets the usual `/v1`."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise AgentError(
            "config", f"{url!r} is not an http(s) URL", hint="e.g. openai:http://127.0.0.1:8000/v1#my-model"
        )
    scheme, _, rest = url.partition("://")
    return url if "/" in rest else url + "/v1"


def _chars(message: dict[str, Any]) -> int:
    calls = message.get("tool_calls") or []
    return len(str(message.get("content") or "")) + sum(len(json.dumps(c)) for c in calls) + 16


def _call_dict(call: Any) -> dict[str, Any]:
    function = call.function
    return {
        "id": call.id or "",
        "type": "function",
        "function": {"name": function.name, "arguments": function.arguments or ""},
    }


def _as_text_message(message: dict[str, Any]) -> dict[str, Any]:
    if message["role"] == "tool":
        return {"role": "user", "content": message["content"]}
    if message.get("tool_calls"):
        calls = "".join(
            "<tool_call>"
            + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
            + "</tool_call>"
            for c in message["tool_calls"]
        )
        return {"role": "assistant", "content": (message.get("content") or "") + calls}
    return message


def _error_text(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message:
            return str(message)[:300]
    return str(getattr(exc, "message", exc))[:300]


def _final_error(exc: Exception, base_url: str, attempts: int) -> AgentError:
    import openai

    if isinstance(exc, openai.RateLimitError):
        return AgentError(
            "rate_limit",
            f"still rate limited (429) after {attempts} attempts: {_error_text(exc)}",
            hint="lower --concurrency",
        )
    if isinstance(exc, openai.APIConnectionError):
        return AgentError(
            "unreachable",
            f"cannot reach {base_url} after {attempts} attempts: {exc.__cause__ or exc}",
            hint="is the server running? check the URL and port",
        )
    status = getattr(exc, "status_code", "5xx")
    return AgentError("server", f"server error ({status}) after {attempts} attempts: {_error_text(exc)}")
