"""serve-engine's weight routes beyond disk, with SGLang 0.5.23's rules.

`/update_weights_from_tensor` and `/update_weights_from_distributed` run only inside a weight-update session
(`/begin_weight_update` ... `/end_weight_update`), as SGLang's scheduler requires; every update flushes the
prefix cache unless `flush_cache` is false, and fails (400, weights loaded) when the flush is refused. Tensor
payloads are base64 safetensors (never pickles); the process group is built as SGLang builds it
(`weight_sync.custom_process_group`) and receives in SGLang's order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from envhub.errors import EngineError
from envhub.trainer.engines.server.state import STATE_KEY, EngineServerState, json_body
from envhub.trainer.engines.weight_sync import WeightGroup, decode_safetensors, receive_named, tensor_sizes

_SELECTORS = ("target", "draft", "all")


def _failure(message: str) -> web.Response:
    return web.json_response({"success": False, "message": message}, status=400)


async def _update(state: EngineServerState, load: Callable, body: dict[str, Any], route: str) -> web.Response:
    """Run one session-bound update; the reply SGLang gives ({success, message}, 400 on failure)."""
    if state.session is None:
        return _failure(f"{route} must run between begin_weight_update() and end_weight_update()")
    try:
        result = await state.update(
            load, body.get("weight_version"), bool(body.get("abort_all_requests", False)), body.get("flush_cache", True)
        )
    except EngineError as exc:
        return _failure(str(exc))
    reply = {"success": result["success"], "message": result["message"]}
    return web.json_response(reply, status=200 if result["success"] else 400)


def _check_served(state: EngineServerState, names: list[str], sizes: list[Any]) -> None:
    """Refuse tensors the served model does not have (before anything is allocated or received)."""
    params = dict(state.engine.model.named_parameters())
    params.update(dict(state.engine.model.named_buffers()))
    for name, (_, size) in zip(names, sizes):
        if name not in params:
            raise EngineError(f"the served model has no tensor {name!r}")
        if params[name].shape != size:
            raise EngineError(f"shape mismatch for {name}: {list(size)} vs served {list(params[name].shape)}")


async def update_from_tensor(request: web.Request) -> web.Response:
    """POST /update_weights_from_tensor {serialized_named_tensors: [one base64 safetensors per TP rank],
    load_format: null, flush_cache, weight_version, abort_all_requests}."""
    state = request.app[STATE_KEY]
    body = await json_body(request)
    payloads = body.get("serialized_named_tensors")
    if not isinstance(payloads, list) or not payloads:
        raise EngineError("serialized_named_tensors must be a non-empty list (one entry per TP rank)")
    if body.get("load_format") is not None:
        raise EngineError("serve-engine takes safetensors payloads: load_format must be null")
    tensors = decode_safetensors(payloads[0])  # rank 0's entry: serve-engine has one rank

    async def load() -> None:
        await state.engine.update_weights(tensors, version=state.engine.version)

    return await _update(state, load, body, "update_weights_from_tensor")


async def init_group(request: web.Request) -> web.Response:
    """POST /init_weights_update_group {master_address, master_port, rank_offset, world_size, group_name,
    backend}: join as rank `rank_offset` (serve-engine is one TP rank)."""
    state = request.app[STATE_KEY]
    body = await json_body(request)
    name = body.get("group_name", "weight_update_group")
    if not isinstance(name, str) or not name:
        raise EngineError("group_name must be a non-empty string")
    if name in state.weight_groups:
        return _failure(f"Failed to initialize custom process group: group {name} exists.")
    try:
        group = await asyncio.to_thread(
            WeightGroup.join,
            str(body["master_address"]),
            int(body["master_port"]),
            int(body["rank_offset"]),
            int(body["world_size"]),
            str(body.get("backend", "nccl")),
            state.engine.model.device,
            name,
        )
    except KeyError as exc:
        raise EngineError(f"init_weights_update_group needs {exc.args[0]}") from exc
    except (RuntimeError, ValueError, TypeError, EngineError) as exc:
        return _failure(f"Failed to initialize custom process group: {exc}.")
    state.weight_groups[name] = group
    return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})


async def update_from_distributed(request: web.Request) -> web.Response:
    """POST /update_weights_from_distributed {names, dtypes, shapes, group_name, load_format (null or
    flattened_bucket), flush_cache, weight_version}: receive one bucket from rank 0 and load it."""
    state = request.app[STATE_KEY]
    body = await json_body(request)
    group = state.weight_groups.get(body.get("group_name", "weight_update_group"))
    if group is None:
        raise EngineError("no weight update group: call /init_weights_update_group first")
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    _check_served(state, names, tensor_sizes(names, dtypes, shapes))

    async def load() -> None:
        tensors = await asyncio.to_thread(receive_named, group, names, dtypes, shapes, body.get("load_format"))
        await state.engine.update_weights(dict(tensors), version=state.engine.version)

    return await _update(state, load, body, "update_weights_from_distributed")


async def destroy_group(request: web.Request) -> web.Response:
    """POST /destroy_weights_update_group {group_name}."""
    state = request.app[STATE_KEY]
    name = (await json_body(request)).get("group_name", "weight_update_group")
    group = state.weight_groups.pop(name, None) if isinstance(name, str) else None
    if group is None:
        return _failure("The group to be destroyed does not exist.")
    await asyncio.to_thread(group.close)
    return web.json_response({"success": True, "message": "Succeeded to destroy custom process group."})


async def begin_update(request: web.Request) -> web.Response:
    """POST /begin_weight_update {selector}: open the session tensor and distributed updates run in."""
    state = request.app[STATE_KEY]
    selector = (await json_body(request)).get("selector", "all")
    if selector not in _SELECTORS:
        raise EngineError(f"selector must be one of {', '.join(_SELECTORS)}, got {selector!r}")
    async with state.gate.update():
        if state.session is not None:
            return _failure("a weight-update session is already open; call end_weight_update() first")
        state.session = selector
    return web.json_response({"success": True, "message": "Success"})


async def end_update(request: web.Request) -> web.Response:
    """POST /end_weight_update: close the session."""
    state = request.app[STATE_KEY]
    await json_body(request)
    async with state.gate.update():
        if state.session is None:
            return _failure("no weight-update session is open; call begin_weight_update() first")
        state.session = None
    return web.json_response({"success": True, "message": "Success"})


def add_routes(app: web.Application, handles_errors: Callable) -> None:
    """Serve the session, tensor and distributed update routes on an envhub serve-engine app."""
    routes = {
        "/update_weights_from_tensor": update_from_tensor,
        "/init_weights_update_group": init_group,
        "/update_weights_from_distributed": update_from_distributed,
        "/destroy_weights_update_group": destroy_group,
        "/begin_weight_update": begin_update,
        "/end_weight_update": end_update,
    }
    for path, handler in routes.items():
        app.router.add_post(path, handles_errors(handler))
