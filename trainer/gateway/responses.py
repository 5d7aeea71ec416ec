"""/v1/responses of the gateway (the OpenAI Agents SDK's default), in the shapes of `openai.types.responses`.

The request's `instructions` and `input` items become chat messages for the model's template: messages (text
parts), `function_call` items (joined to the assistant message before them, as one turn with tool calls) and
`function_call_output` items (tool results); `reasoning` items are skipped. The answer comes back as an output
`message` item and one `function_call` item per tool call; `stream: true` sends the event sequence the `openai`
client assembles (created, in_progress, per item added / deltas / done, completed). The gateway keeps no
conversation state: `previous_response_id` is refused (send the whole input, as the Agents SDK does by default).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from aiohttp import web

from envhub.trainer.gateway.chat import Gateway, sse
from envhub.trainer.gateway.episodes import EPISODE, RecordedCall
from envhub.trainer.gateway.errors import RequestError


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Responses function tools ({type: function, name, parameters}) as chat tools; 400 for other kinds."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError(400, "tools must be a list", param="tools")
    out = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestError(
                400, f"tools[{index}]: only function tools are served here, got {kind!r}", param=f"tools[{index}]"
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise RequestError(400, "tool_choice must be auto or none at this gateway", param="tool_choice")
    return out if out and body.get("tool_choice") != "none" else None


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(p.get("text", "") for p in output if isinstance(p, dict))
    raise RequestError(400, "function_call_output.output must be a string or a list of text parts", param="input")


def to_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's instructions and input items as chat messages."""
    if body.get("previous_response_id") is not None:
        raise RequestError(
            400,
            "previous_response_id is not supported: this gateway keeps no conversation state; send the whole input",
            param="previous_response_id",
        )
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError(400, "input must be a string or a non-empty list of input items", param="input")
    for index, item in enumerate(items):
        where = f"input[{index}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append({"role": item.get("role"), "content": item.get("content")})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or ""),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("closed"):
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _output_text(item.get("output"))
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": output})
        elif kind != "reasoning":
            raise RequestError(400, f"{where}: input items of type {kind!r} are not supported here", param=where)
    return messages


def output_items(call: RecordedCall) -> list[dict[str, Any]]:
    """The call's answer as Responses output items: a message (when it has text or no calls), then function calls."""
    message = call.message
    calls = message.get("tool_calls") or []
    items: list[dict[str, Any]] = []
    if message.get("content") or not calls:
        part = {"type": "output_text", "text": message.get("content") or "", "annotations": [], "logprobs": []}
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [part],
            }
        )
    for tool_call in calls:
        items.append(
            {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "call_id": tool_call["id"],
                "name": tool_call["function"]["name"],
                "arguments": tool_call["function"]["arguments"],
                "status": "completed",
            }
        )
    return items


def _response(gateway: Gateway, body: dict[str, Any], call: RecordedCall | None, rid: str) -> dict[str, Any]:
    length = call is not None and call.finish_reason == "length"
    response: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": time.time(),
        "model": gateway.model_name,
        "status": "in_progress" if call is None else "incomplete" if length else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if length else None,
        "error": None,
        "instructions": body.get("instructions"),
        "metadata": {},
        "output": output_items(call) if call is not None else [],
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
    }
    if call is not None:
        prompt, output = len(call.prompt_ids), len(call.output_ids)
        response["usage"] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output,
        }
    return response


def _item_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The events that build one output item: added, its content or arguments (delta, done), done."""
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "message":
        part = item["content"][0]
        text = part["text"]
        return [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "content": []}},
            {"type": "response.content_part.added", **at, "content_index": 0, "part": {**part, "text": ""}},
            {"type": "response.output_text.delta", **at, "content_index": 0, "delta": text, "logprobs": []},
            {"type": "response.output_text.done", **at, "content_index": 0, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **at, "content_index": 0, "part": part},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    started = {**item, "arguments": "", "status": "in_progress"}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": started},
        {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
        {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"], "name": item["name"]},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def responses_handler(gateway: Gateway) -> Any:
    """POST /v1/responses {model, input, instructions?, tools?, max_output_tokens?, stream?, ...}."""

    async def responses(request: web.Request) -> web.StreamResponse:
        body = await gateway.body(request)
        tools = _tools(body)
        prompt = await asyncio.to_thread(gateway.renderer.prompt, to_messages(body), tools, request[EPISODE])
        chat_body = {**body, "max_tokens": body.get("max_output_tokens")}
        call = await gateway.complete(request, chat_body, prompt, "responses", tools is not None)
        rid = f"resp_{uuid.uuid4().hex}"
        final = _response(gateway, body, call, rid)
        if not body.get("stream"):
            return web.json_response(final)
        pending = _response(gateway, body, None, rid)
        events = [{"type": f"response.{kind}", "response": pending} for kind in ("created", "in_progress")]
        for index, item in enumerate(final["output"]):
            events += _item_events(item, index)
        events.append({"type": "response.completed", "response": final})
        numbered = [(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)]
        return await sse(request, numbered, False)

    return responses


def add_routes(app: web.Application, gateway: Gateway) -> None:
    """Serve /v1/responses."""
    app.router.add_post("/v1/responses", responses_handler(gateway))
