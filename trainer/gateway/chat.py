"""/v1/chat/completions and /v1/completions of the gateway, in OpenAI's shapes (streamed as SSE chunks with
`stream: true`, ending `data: [DONE]`; usage in a last chunk with `stream_options.include_usage`)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Protocol

from aiohttp import web

from envhub.trainer.gateway.episodes import EPISODE, RecordedCall
from envhub.trainer.gateway.errors import RequestError
from envhub.trainer.gateway.render import ChatRenderer, Prompt


class Gateway(Protocol):
    """What the routes use of `app.Gateway`: the trust-checked body, the renderer and one recorded generation."""

    renderer: ChatRenderer
    vocab_size: int

    @property
    def model_name(self) -> str: ...

    async def body(self, request: web.Request) -> dict[str, Any]: ...

    async def complete(
        self, request: web.Request, body: dict[str, Any], prompt: Prompt, route: str, tools_offered: bool
    ) -> RecordedCall: ...

    def text(self, ids: list[int]) -> str: ...


def finish_reason(call: RecordedCall) -> str:
    """OpenAI's finish reason of a recorded call."""
    if call.message.get("tool_calls"):
        return "tool_calls"
    return "length" if call.finish_reason == "length" else "stop"


def usage(call: RecordedCall) -> dict[str, int]:
    """Token counts as OpenAI reports them."""
    prompt, completion = len(call.prompt_ids), len(call.output_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def tools_of(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's function tools ({type: function, function: {name, ...}}); 400 for other shapes."""
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise RequestError(400, "tools must be a list of {type: function, function: {name, parameters}}", param="tools")
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise RequestError(400, "tool_choice must be auto or none at this gateway", param="tool_choice")
    return tools if body.get("tool_choice") != "none" else None


async def sse(request: web.Request, events: list[tuple[str | None, dict[str, Any]]], done: bool) -> web.StreamResponse:
    """Send `events` ((event name or None, data)) as server-sent events, then `data: [DONE]` when `done`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for name, data in events:
        head = f"event: {name}\n".encode() if name else b""
        await response.write(head + b"data: " + json.dumps(data).encode() + b"\n\n")
    if done:
        await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _logprobs(gateway: Gateway, call: RecordedCall) -> dict[str, Any]:
    return {
        "content": [
            {"token": gateway.text([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(call.output_ids, call.logprobs)
        ]
    }


def _chunks(base: dict[str, Any], call: RecordedCall, include_usage: bool) -> list[tuple[None, dict[str, Any]]]:
    message = call.message
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": message.get("content") or ""}]
    for index, tool_call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": index, **tool_call}]})
    choices = [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas]
    choices.append({"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason(call)})
    chunks = [(None, {**base, "choices": [c]}) for c in choices]
    if include_usage:
        chunks.append((None, {**base, "choices": [], "usage": usage(call)}))
    return chunks


def chat_handler(gateway: Gateway) -> Any:
    """POST /v1/chat/completions {model, messages, tools?, max_tokens?, temperature?, stream?, logprobs?, ...}."""

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        body = await gateway.body(request)
        tools = tools_of(body)
        prompt = await asyncio.to_thread(gateway.renderer.prompt, body.get("messages"), tools, request[EPISODE])
        call = await gateway.complete(request, body, prompt, "chat.completions", tools is not None)
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": gateway.model_name,
            "system_fingerprint": None,
        }
        if body.get("stream"):
            options = body.get("stream_options") or {}
            include = bool(options.get("include_usage")) if isinstance(options, dict) else False
            return await sse(request, _chunks({**base, "object": "chat.completion.chunk"}, call, include), True)
        choice = {
            "index": 0,
            "message": call.message,
            "logprobs": _logprobs(gateway, call) if body.get("logprobs") else None,
            "finish_reason": finish_reason(call),
        }
        return web.json_response({**base, "object": "chat.completion", "choices": [choice], "usage": usage(call)})

    return chat_completions


def completions_handler(gateway: Gateway) -> Any:
    """POST /v1/completions {model, prompt (text or token ids), max_tokens?, stream?, ...}: the raw prompt, no
    template (what a harness sends is what the model sees, here literally)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await gateway.body(request)
        raw = body.get("prompt")
        if isinstance(raw, str) and raw:
            ids = await asyncio.to_thread(gateway.renderer.encode, raw)
        elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            if any(not 0 <= t < gateway.vocab_size for t in raw):
                raise RequestError(400, f"prompt token ids must be in [0, {gateway.vocab_size})", param="prompt")
            ids = list(raw)
        else:
            raise RequestError(400, "prompt must be a non-empty string or a list of token ids", param="prompt")
        call = await gateway.complete(request, body, Prompt(ids, 0, 0), "completions", False)
        base = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": gateway.model_name,
        }
        choice = {
            "index": 0,
            "text": call.message["content"],
            "logprobs": None,
            "finish_reason": "length" if call.finish_reason == "length" else "stop",
        }
        if body.get("stream"):
            return await sse(request, [(None, {**base, "choices": [choice]})], True)
        return web.json_response({**base, "choices": [choice], "usage": usage(call)})

    return completions


def add_routes(app: web.Application, gateway: Gateway) -> None:
    """Serve the chat and text completion routes."""
    app.router.add_post("/v1/chat/completions", chat_handler(gateway))
    app.router.add_post("/v1/completions", completions_handler(gateway))
