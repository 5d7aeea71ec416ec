"""OpenAI-compatible routes of `envhub serve-engine`: /v1/models, /v1/completions, /v1/chat/completions.

Shapes follow OpenAI's API as SGLang serves it (checked with the `openai` package as the client and
SGLang's `protocol` models): chat prompts go through the model's chat template (with `tools`), tool calls in
the output (Hermes/Qwen `<tool_call>` or JSON) come back as `tool_calls`, `stream: true` sends SSE chunks
ending with `data: [DONE]`. Errors are OpenAI-style `{"error": {message, type, param, code}}` with 400.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from envhub.errors import EngineError
from envhub.inference import GenerateResult
from envhub.trainer.engines.protocol import GenerateCall, parse_sampling


class ContextLengthError(EngineError):
    """Prompt plus completion exceed the model's context; answered as OpenAI's `context_length_exceeded`."""


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}, status=status
    )


def _failure(exc: EngineError) -> web.Response:
    """The 400 for `exc`; context overflows carry OpenAI's code so clients can tell them from other bad requests."""
    if isinstance(exc, ContextLengthError):
        return web.json_response(
            {
                "error": {
                    "message": str(exc),
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
            status=400,
        )
    return _error(str(exc))


def sampling_json(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI request fields as SGLang sampling_params."""
    params: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        params["max_new_tokens"] = max_tokens
    mapping = {
        "temperature": "temperature",
        "top_p": "top_p",
        "top_k": "top_k",
        "min_p": "min_p",
        "seed": "sampling_seed",
        "frequency_penalty": "frequency_penalty",
        "presence_penalty": "presence_penalty",
        "repetition_penalty": "repetition_penalty",
        "stop": "stop",
        "stop_token_ids": "stop_token_ids",
        "ignore_eos": "ignore_eos",
        "min_tokens": "min_new_tokens",
        "n": "n",
    }
    for source, target in mapping.items():
        if body.get(source) is not None:
            params[target] = body[source]
    return params


def _finish(result: GenerateResult, has_tools: bool) -> str:
    if has_tools:
        return "tool_calls"
    return {"stop": "stop", "length": "length", "abort": "abort"}[result.finish_reason]


def _usage(prompt: int, results: list[GenerateResult]) -> dict[str, int]:
    completion = sum(len(r.output_ids) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_message(text: str, tools: Any) -> tuple[dict[str, Any], bool]:
    """The assistant message for `text`; tool calls parsed out when the request offered tools."""
    if tools:
        from envhub.toolcalls import parse_tool_calls

        parsed = parse_tool_calls(text)
        if parsed.calls:
            calls = [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in parsed.calls
            ]
            return {"role": "assistant", "content": parsed.text or None, "tool_calls": calls}, True
    return {"role": "assistant", "content": text}, False


async def _sse(request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _body(request: web.Request) -> dict[str, Any]:
    from envhub.trainer.engines.server.state import json_body

    return await json_body(request)


async def _run(
    request: web.Request, ids: list[int], body: dict[str, Any], source: str = "messages"
) -> list[GenerateResult]:
    import asyncio

    from envhub.trainer.engines.server.state import STATE_KEY

    state = request.app[STATE_KEY]
    sampling, n = parse_sampling(sampling_json(body), state.engine.vocab_size)
    if not ids:
        raise EngineError("the prompt is empty")
    if len(ids) + sampling.max_new_tokens > state.context_len:
        wanted = len(ids) + sampling.max_new_tokens  # OpenAI's wording, which clients match on
        raise ContextLengthError(
            f"This model's maximum context length is {state.context_len} tokens. However, you requested "
            f"{wanted} tokens ({len(ids)} in the {source}, {sampling.max_new_tokens} in the completion). "
            f"Please reduce the length of the {source} or completion."
        )
    call = GenerateCall(ids, sampling, None, n)
    return list(await asyncio.gather(*[state.run(call, i) for i in range(n)]))


def _model_name(request: web.Request) -> str:
    from envhub.trainer.engines.server.state import STATE_KEY

    return request.app[STATE_KEY].served_model_name


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the one served model."""
    from envhub.trainer.engines.server.state import STATE_KEY

    state = request.app[STATE_KEY]
    card = {
        "id": state.served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "envhub",
        "root": state.served_model_name,
        "max_model_len": state.context_len,
    }
    return web.json_response({"object": "list", "data": [card]})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions {messages, tools?, max_tokens, temperature, n, stream, ...}."""
    from envhub.trainer.engines.server.state import STATE_KEY

    state = request.app[STATE_KEY]
    try:
        body = await _body(request)
        messages, tools = body.get("messages"), body.get("tools") or None
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and "role" in m for m in messages)
        ):
            raise EngineError("messages must be a non-empty list of {role, content} objects")
        if state.engine.tokenizer is None:
            raise EngineError("this server has no tokenizer for chat templates")
        functions = [t.get("function", t) for t in tools] if isinstance(tools, list) else None
        try:
            ids = state.engine.tokenizer.apply_chat_template(
                messages, tools=functions, add_generation_prompt=True, tokenize=True
            )
        except Exception as exc:  # a template error is the client's message shape
            raise EngineError(f"cannot apply the chat template: {exc}") from exc
        ids = list(ids["input_ids"]) if isinstance(ids, dict) or hasattr(ids, "keys") else list(ids)
        results = await _run(request, ids, body)
    except EngineError as exc:
        return _failure(exc)
    created, rid = int(time.time()), f"chatcmpl-{uuid.uuid4().hex}"
    choices = []
    for index, result in enumerate(results):
        message, called = chat_message(state.text(result.output_ids), tools)
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": _finish(result, called)}
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": state.text([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(result.output_ids, result.logprobs)
                ]
            }
        choices.append(choice)
    if body.get("stream"):
        chunks = [
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": state.served_model_name,
                "choices": [
                    {
                        "index": c["index"],
                        "delta": {"role": "assistant", **{k: v for k, v in c["message"].items() if k != "role"}},
                        "finish_reason": None,
                    }
                ],
            }
            for c in choices
        ]
        chunks += [
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": state.served_model_name,
                "choices": [{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}],
            }
            for c in choices
        ]
        return await _sse(request, chunks)
    return web.json_response(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": state.served_model_name,
            "choices": choices,
            "usage": _usage(len(ids), results),
        }
    )


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions {prompt (text or token ids), max_tokens (default 16), temperature, n, stream, ...}."""
    from envhub.trainer.engines.server.state import STATE_KEY

    state = request.app[STATE_KEY]
    try:
        body = await _body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, str) and state.engine.tokenizer is not None:
            ids = state.engine.tokenizer.encode(prompt)
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            ids = prompt
            if any(not 0 <= t < state.engine.vocab_size for t in ids):
                raise EngineError(f"prompt token ids must be in [0, {state.engine.vocab_size})")
        else:
            raise EngineError("prompt must be a string or a list of token ids")
        body = {**body, "max_tokens": body.get("max_tokens", 16)}
        results = await _run(request, ids, body, "prompt")
    except EngineError as exc:
        return _failure(exc)
    created, rid = int(time.time()), f"cmpl-{uuid.uuid4().hex}"
    choices = [
        {"index": i, "text": state.text(r.output_ids), "logprobs": None, "finish_reason": _finish(r, False)}
        for i, r in enumerate(results)
    ]
    if body.get("stream"):
        chunks = [
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": state.served_model_name,
                "choices": [c],
            }
            for c in choices
        ]
        return await _sse(request, chunks)
    return web.json_response(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": state.served_model_name,
            "choices": choices,
            "usage": _usage(len(ids), results),
        }
    )


def add_routes(app: web.Application) -> None:
    """Serve the OpenAI-compatible routes."""
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
