"""`envhub serve-engine`: a EmbeddedEngine behind SGLang's native HTTP API, with SGLang's semantics.

Native routes: POST|PUT /generate (SSE with `stream: true`), POST /update_weights_from_disk,
/begin_weight_update, /end_weight_update, /update_weights_from_tensor, /init_weights_update_group,
/update_weights_from_distributed, /destroy_weights_update_group (those in `server.weights`),
/update_weight_version, /pause_generation, /continue_generation, /abort_request, GET|POST /flush_cache,
GET /health, /health_generate, /ready, /model_info, /get_model_info. OpenAI-compatible routes live in
`openai_api`; the API key, bind and weights-directory rules in `server.security`; the update/generation
admission rules in `gate`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from envhub.errors import EngineError
from envhub.inference import GenerateResult
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.protocol import GenerateCall, generate_response, parse_generate
from envhub.trainer.engines.server.security import (
    BODY_TIMEOUT_S,
    WeightsPolicy,
    api_key_middleware,
    body_deadline_middleware,
    default_weights_dir,
)
from envhub.trainer.engines.server.state import STATE_KEY, EngineServerState, error_response, json_body

DEFAULT_MAX_BODY = 64 * 1024 * 1024


def _handles_errors(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except EngineError as exc:
            return error_response(400, str(exc))

    wrapped.__doc__ = handler.__doc__
    return wrapped


def _expanded(calls: list[GenerateCall]) -> list[tuple[GenerateCall, int]]:
    return [(call, i) for call in calls for i in range(call.n)]


async def generate(request: web.Request) -> web.StreamResponse:
    """POST /generate: one prompt or a batch; SSE chunks (cumulative, as SGLang) with `stream: true`."""
    state = request.app[STATE_KEY]
    body = await json_body(request)
    calls, batch = parse_generate(body, state.engine.tokenizer, state.engine.vocab_size, state.context_len)
    return_logprob = body.get("return_logprob", False)
    if not isinstance(return_logprob, bool):
        raise EngineError("return_logprob must be a boolean")
    jobs = _expanded(calls)
    if body.get("stream"):
        return await _stream(request, state, jobs, return_logprob)
    results = await asyncio.gather(*[state.run(call, i) for call, i in jobs])
    outs = [generate_response(r, state.text(r.output_ids), return_logprob, state.spans(r)) for r in results]
    return web.json_response(outs if batch or len(outs) > 1 else outs[0])


async def _stream(
    request: web.Request, state: EngineServerState, jobs: list[tuple[GenerateCall, int]], return_logprob: bool
) -> web.StreamResponse:
    """SSE: `data: {json}` per update (text, output_ids and logprobs so far, `index` for batches), then `data:
    [DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    updates: asyncio.Queue = asyncio.Queue()
    progress: list[list[tuple[int, float, int]]] = [[] for _ in jobs]

    def listener(index: int) -> Callable[[int, float, int], None]:
        def on_token(token: int, logprob: float, version: int) -> None:  # runs in the engine's worker thread
            loop.call_soon_threadsafe(updates.put_nowait, (index, (token, logprob, version)))

        return on_token

    async def one(index: int, call: GenerateCall, n: int) -> None:
        try:
            result = await state.run(call, n, on_token=listener(index))
            await updates.put((index, result))
        except EngineError as exc:
            await updates.put((index, exc))

    tasks = [asyncio.create_task(one(i, call, n)) for i, (call, n) in enumerate(jobs)]
    try:
        done = 0
        while done < len(jobs):
            index, item = await updates.get()
            if isinstance(item, tuple):
                progress[index].append(item)
                ids = [t for t, _, _ in progress[index]]
                partial = GenerateResult(
                    ids,
                    [lp for _, lp, _ in progress[index]],
                    "abort",
                    token_versions=[v for _, _, v in progress[index]],
                    meta={"rid": call_rid(jobs[index][0])},
                )
                out = generate_response(partial, state.text(ids), return_logprob, state.spans(partial))
                out["meta_info"]["finish_reason"] = None
            elif isinstance(item, EngineError):
                out, done = (
                    {"error": {"message": str(item), "type": "invalid_request_error", "code": 400, "retryable": False}},
                    done + 1,
                )
            else:
                out, done = (
                    generate_response(item, state.text(item.output_ids), return_logprob, state.spans(item)),
                    done + 1,
                )
            if len(jobs) > 1:
                out["index"] = index
            await response.write(b"data: " + json.dumps(out).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
    finally:
        for task in tasks:
            task.cancel()  # a vanished client aborts its requests
    await response.write_eof()
    return response


def call_rid(call: GenerateCall) -> str:
    return call.rid or ""


async def update_weights_from_disk(request: web.Request) -> web.Response:
    """POST /update_weights_from_disk {model_path, load_format, weight_version, abort_all_requests, flush_cache}."""
    state = request.app[STATE_KEY]
    body = await json_body(request)
    try:
        if not isinstance(body.get("flush_cache", True), bool):
            raise EngineError(f"flush_cache must be a boolean, got {body['flush_cache']!r}")
        path = state.weights.check(body.get("model_path"), body.get("load_format"))
        from envhub.trainer.engines.weights import read_state

        async def load() -> None:
            tensors = await asyncio.to_thread(read_state, path)
            await state.engine.update_weights(tensors, version=state.engine.version)

        reply = await state.update(
            load,
            body.get("weight_version"),
            bool(body.get("abort_all_requests", False)),
            body.get("flush_cache", True),
        )
    except EngineError as exc:
        return web.json_response({"success": False, "message": str(exc), "num_paused_requests": 0}, status=400)
    state.model_path = state.served_model_name = str(body["model_path"])  # loaded, even if the flush was refused
    return web.json_response(reply, status=200 if reply["success"] else 400)


async def update_weight_version(request: web.Request) -> web.Response:
    """POST /update_weight_version {new_version, abort_all_requests}."""
    state = request.app[STATE_KEY]
    body = await json_body(request)
    if not isinstance(body.get("new_version"), str):
        raise EngineError("new_version must be a string")
    if body.get("abort_all_requests"):
        await state.abort(None)
    state.set_label(body["new_version"])
    return web.json_response(
        {
            "success": True,
            "message": f"Weight version updated to {body['new_version']}",
            "new_version": body["new_version"],
        }
    )


async def pause_generation(request: web.Request) -> web.Response:
    """POST /pause_generation {mode: abort (default) | retract | in_place}."""
    state = request.app[STATE_KEY]
    mode = (await json_body(request)).get("mode", "abort")
    if mode not in ("abort", "retract", "in_place"):
        raise EngineError(f"mode must be abort, retract or in_place, got {mode!r}")
    await state.gate.pause()
    if mode == "abort":
        while state.gate.in_flight:  # as SGLang: abort everything until no generation holds the lock
            await state.abort(None)
            await state.gate.wait_idle(0.05)
    else:
        await state.engine.pause(mode=mode)
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(request: web.Request) -> web.Response:
    """POST /continue_generation."""
    state = request.app[STATE_KEY]
    await state.engine.resume()
    await state.gate.resume()
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


async def abort_request(request: web.Request) -> web.Response:
    """POST /abort_request {rid} (every running rid starting with it) or {abort_all: true}; 200 with no body."""
    state = request.app[STATE_KEY]
    body = await json_body(request)
    rid, abort_all = body.get("rid", ""), body.get("abort_all", False)
    if not isinstance(rid, str) or not isinstance(abort_all, bool):
        raise EngineError("abort_request takes rid (a string) and abort_all (a boolean)")
    if abort_all or rid:  # an empty rid without abort_all is ignored, as SGLang does
        await state.abort(None if abort_all else rid)
    return web.Response(status=200)


async def flush_cache(request: web.Request) -> web.Response:
    """GET|POST /flush_cache: 200 when idle, 400 while requests run (as SGLang)."""
    if await request.app[STATE_KEY].engine.flush_cache():
        return web.Response(text="Cache flushed.\n")
    return web.Response(status=400, text="Cache not flushed: requests are running or waiting.\n")


async def health(request: web.Request) -> web.Response:
    """GET /health and /health_generate: 200 once a 1-token generation gets through (SGLang's check, so it waits
    out a pause); 503 when the engine cannot serve or nothing came within the timeout (then /ready is 503 too)."""
    return web.Response(status=200 if await request.app[STATE_KEY].health_check() else 503)


async def ready(request: web.Request) -> web.Response:
    """GET /ready: 200 when healthy and not paused, else 503 (SGLang's readiness; no generation)."""
    return web.Response(status=200 if await request.app[STATE_KEY].ready() else 503)


async def model_info(request: web.Request) -> web.Response:
    """GET /model_info (and the deprecated /get_model_info): SGLang's fields, weight_version included."""
    state = request.app[STATE_KEY]
    config = getattr(state.engine.model, "config", None)
    return web.json_response(
        {
            "model_path": state.model_path,
            "served_model_name": state.served_model_name,
            "tokenizer_path": state.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": state.weight_version,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
        }
    )


def create_app(
    engine: EmbeddedEngine,
    model_path: str = "",
    *,
    api_key: str | None = None,
    admin_api_key: str | None = None,
    weights_dirs: Iterable[str | Path] | None = None,
    weight_version: str = "default",
    served_model_name: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    health_check_timeout: float = 20.0,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> web.Application:
    """The aiohttp application serving `engine` (closed on shutdown); `health_check_timeout` is SGLang's
    SGLANG_HEALTH_CHECK_TIMEOUT (how long /health waits for a token)."""
    from envhub.trainer.engines.server import openai_api
    from envhub.trainer.engines.server import weights as server_weights

    middlewares = [api_key_middleware(api_key, admin_api_key), body_deadline_middleware(body_timeout_s)]
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    dirs = list(weights_dirs) if weights_dirs is not None else [default_weights_dir()]
    state = EngineServerState(
        engine,
        model_path,
        WeightsPolicy.of(dirs),
        served_model_name=served_model_name or model_path or "default",
        health_check_timeout=health_check_timeout,
    )
    state.labels[engine.version] = weight_version
    app[STATE_KEY] = state
    for method in ("POST", "PUT"):
        app.router.add_route(method, "/generate", _handles_errors(generate))
    routes = {
        "/update_weights_from_disk": update_weights_from_disk,
        "/update_weight_version": update_weight_version,
        "/pause_generation": pause_generation,
        "/continue_generation": continue_generation,
        "/abort_request": abort_request,
    }
    for path, handler in routes.items():
        app.router.add_post(path, _handles_errors(handler))
    server_weights.add_routes(app, _handles_errors)
    openai_api.add_routes(app)
    app.router.add_get("/flush_cache", flush_cache)
    app.router.add_post("/flush_cache", flush_cache)
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, health)
    app.router.add_get("/ready", ready)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)

    async def close_engine(_: web.Application) -> None:
        await engine.close()

    app.on_shutdown.append(close_engine)
    return app


@dataclass
class RunningServer:
    """An engine server started in the current event loop; `url` is its base address."""

    runner: web.AppRunner
    url: str
    api_key: str | None = None

    async def stop(self) -> None:
        """Shut the server and its engine down."""
        await self.runner.cleanup()


async def start_engine_server(
    engine: EmbeddedEngine, host: str = "127.0.0.1", port: int = 0, model_path: str = "", **options: Any
) -> RunningServer:
    """Serve `engine` in this event loop (port 0 picks a free port); options go to `create_app`."""
    from envhub.trainer.engines.server.security import check_bind

    check_bind(host, options.get("api_key"))
    runner = web.AppRunner(create_app(engine, model_path, **options), handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    return RunningServer(runner, f"http://{host}:{bound}", options.get("api_key"))


async def serve_to_workers(engine: EmbeddedEngine, *, host: str, bind: str, api_key: str | None) -> tuple[str, Any]:
    """Serve an in-process engine to rollout workers in other processes: listen on `bind` (a free port), return
    the base URL they reach it at through `host`, and the running server (stopping it closes the engine)."""
    server = await start_engine_server(engine, host=bind, api_key=api_key)
    return f"http://{host}:{server.url.rsplit(':', 1)[1]}", server
