"""`envhub serve-engine`'s own app (its /v1 routes) on 127.0.0.1 for OpenAI-client tests, behind a fault middleware.

Answers come from a real model: `EmbeddedEngine` over a tiny random Llama with the SmolLM2 tokenizer, served by
`trainer.engines.server.create_app` exactly as `envhub serve-engine` serves it. The fault middleware, put in
front of the app's own middlewares, injects what real endpoints do wrong (401 for a wrong key, 429 with
Retry-After, 5xx, slow answers, servers without tool calling). Its one scripted piece, `FaultPlan.scripted`,
replaces a chat answer with a given assistant message: the only way to make a random model emit a (well- or
ill-formed) native tool call.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web


@dataclass
class FaultPlan:
    """What the middleware does to the next requests; tests edit it between requests."""

    api_key: str | None = None  # when set, any other bearer token gets 401
    statuses: list[tuple[int, dict[str, str]]] = field(
        default_factory=list
    )  # next answers: (status, headers), consumed in order
    scripted: list[dict[str, Any]] = field(
        default_factory=list
    )  # next chat answers replaced by these assistant messages
    no_tools: bool = False  # refuse requests carrying `tools`, like servers without tool calling
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)  # every JSON body received, in order

    def clear(self) -> None:
        self.api_key, self.statuses, self.scripted, self.no_tools, self.delay_s = None, [], [], False, 0.0
        self.requests.clear()


def _error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}, status=status, headers=headers
    )


def fault_middleware(plan: FaultPlan) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.json() if request.body_exists and await request.read() else {}
        plan.requests.append({"path": request.path, **body})
        if plan.delay_s:
            await asyncio.sleep(plan.delay_s)
        if plan.api_key is not None and request.headers.get("Authorization") != f"Bearer {plan.api_key}":
            return _error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        if plan.statuses:
            status, headers = plan.statuses.pop(0)
            return _error(
                status,
                f"injected HTTP {status}",
                "server_error" if status >= 500 else "rate_limit_error",
                headers=headers,
            )
        if request.path.endswith("/chat/completions"):
            if plan.no_tools and body.get("tools"):
                return _error(400, "tools are not supported by this server", code="unsupported_parameter")
            if plan.scripted:  # scripted reply, not the model's
                return web.json_response(
                    _chat_response(body.get("model", ""), plan.scripted.pop(0), "tool_calls", 0, 0)
                )
        return await handler(request)

    return middleware


def _chat_response(
    model: str, message: dict[str, Any], finish: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish, "logprobs": None}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


@dataclass
class CompatServer:
    """A running server: where it listens, its fault plan, and the engine behind it."""

    base_url: str
    faults: FaultPlan
    engine: Any
    model: str
    loop: asyncio.AbstractEventLoop


def start_compat_server(engine: Any, model_name: str = "tiny-llama") -> tuple[CompatServer, Any]:
    """Serve-engine's app over `engine` on 127.0.0.1 (a free port) from a background thread; returns it and a stop
    function."""
    from envhub.trainer.engines.server.app import create_app

    plan = FaultPlan()
    loop = asyncio.new_event_loop()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        app = create_app(engine, served_model_name=model_name)
        app.middlewares.insert(0, fault_middleware(plan))  # outermost, before serve-engine's API-key check
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        holder["runner"], holder["port"] = runner, runner.addresses[0][1]

    thread = threading.Thread(target=loop.run_forever, name="openai-compat-server", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(timeout=30)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

    return CompatServer(f"http://127.0.0.1:{holder['port']}/v1", plan, engine, model_name, loop), stop


@pytest.fixture(scope="module")
def compat_server() -> Iterator[CompatServer]:
    """One server per test module over a tiny random Llama with the SmolLM2 tokenizer."""
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.models import load_tokenizer, tiny_llama

    tokenizer = load_tokenizer("tiny")
    engine = EmbeddedEngine(tiny_llama(tokenizer, seed=0), tokenizer)
    server, stop = start_compat_server(engine)
    server.tokenizer = tokenizer  # type: ignore[attr-defined]
    yield server
    stop()


@pytest.fixture
def openai_server(compat_server: CompatServer) -> Iterator[CompatServer]:
    """The module's server with a clean fault plan."""
    compat_server.faults.clear()
    yield compat_server
    compat_server.faults.clear()
