"""Weights from the learner to a serving engine without a disk round trip, per SGLang's API.

- Tensor path (`POST /update_weights_from_tensor`, a colocated server): the tensors travel in the request.
  SGLang expects `MultiprocessingSerializer` pickles (CUDA IPC handles on one machine); envhub serve-engine
  accepts base64 safetensors instead, because unpickling a client's bytes would run its code.
- Distributed path (`POST /init_weights_update_group` once, then `POST /update_weights_from_distributed`
  per push): the trainer is rank 0 of a process group with every server and broadcasts each tensor
  (NCCL on GPUs; gloo here, on CPU).
- Disk (`/update_weights_from_disk`) stays the fallback for servers that cannot join either.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from envhub.errors import EngineError

_DTYPES = {
    str(t).removeprefix("torch."): t
    for t in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32)
}


def encode_safetensors(named: Mapping[str, torch.Tensor]) -> str:
    """Tensors as base64 safetensors bytes (the envhub serve-engine tensor format)."""
    from safetensors.torch import save

    return base64.b64encode(save({k: v.detach().contiguous().cpu() for k, v in named.items()})).decode()


def decode_safetensors(payload: Any) -> dict[str, torch.Tensor]:
    """The inverse of `encode_safetensors`; EngineError for anything else (pickles are refused)."""
    from safetensors.torch import load

    if not isinstance(payload, str):
        raise EngineError("serialized_named_tensors entries must be base64 strings")
    try:
        return load(base64.b64decode(payload, validate=True))
    except Exception as exc:
        raise EngineError(
            "serialized_named_tensors must be base64 safetensors: this server never unpickles client data"
        ) from exc


def encode_sglang(named: Mapping[str, torch.Tensor], tp_size: int = 1) -> list[str]:
    """Tensors as SGLang's MultiprocessingSerializer payloads (ForkingPickler, base64), one per TP rank."""
    import io
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  registers the tensor reductions (shared memory / CUDA IPC)

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(list(named.items()))
    return [base64.b64encode(buffer.getvalue()).decode()] * tp_size


@dataclass
class WeightGroup:
    """One side of an `/init_weights_update_group` process group."""

    group: Any
    rank: int
    world_size: int
    device: torch.device

    @classmethod
    def join(
        cls,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        device: torch.device,
        timeout_s: float = 300.0,
    ) -> WeightGroup:
        """Connect to the TCP store at master (rank 0 hosts it) and form the group (blocks until all join)."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(master_address, int(master_port), world_size, is_master=rank == 0, timeout=timeout)
        if backend == "nccl":
            group = dist.ProcessGroupNCCL(store, rank, world_size)
        elif backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_default_device()]
            group = dist.ProcessGroupGloo(store, rank, world_size, options)
        else:
            raise EngineError(f"backend must be nccl or gloo, got {backend!r}")
        return cls(group, rank, world_size, device)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Broadcast from rank 0 into `tensor` (in place on the receivers)."""
        self.group.broadcast(tensor, 0).wait()
        return tensor


def receive_named(
    group: WeightGroup, names: list[str], dtypes: list[str], shapes: list[list[int]]
) -> dict[str, torch.Tensor]:
    """Receive the tensors rank 0 broadcasts, in order (`/update_weights_from_distributed` on the server)."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise EngineError("names, dtypes and shapes must have the same length")
    out = {}
    for name, dtype, shape in zip(names, dtypes, shapes):
        if dtype not in _DTYPES:
            raise EngineError(f"unsupported dtype {dtype!r}", hint=f"use one of {sorted(_DTYPES)}")
        out[name] = group.broadcast(torch.empty([int(s) for s in shape], dtype=_DTYPES[dtype], device=group.device))
    return out


def add_routes(app: Any, handles_errors: Callable) -> None:
    """Serve the tensor and distributed update routes on an envhub serve-engine app."""
    from aiohttp import web

    from envhub.trainer.engines.server_state import STATE_KEY, json_body

    async def reply(state: Any, load: Callable, body: dict[str, Any]) -> web.Response:
        try:
            result = await state.update(load, body.get("weight_version"), bool(body.get("abort_all_requests", False)))
        except EngineError as exc:
            return web.json_response({"success": False, "message": str(exc)}, status=400)
        return web.json_response({"success": True, "message": result["message"]})

    async def update_from_tensor(request: web.Request) -> web.Response:
        """POST /update_weights_from_tensor {serialized_named_tensors: [base64 safetensors], weight_version}."""
        state = request.app[STATE_KEY]
        body = await json_body(request)
        payloads = body.get("serialized_named_tensors")
        if not isinstance(payloads, list) or not payloads:
            raise EngineError("serialized_named_tensors must be a non-empty list (one entry per TP rank)")
        tensors = decode_safetensors(payloads[0])

        async def load() -> None:
            await state.engine.update_weights(tensors, version=state.engine.version)

        return await reply(state, load, body)

    async def init_group(request: web.Request) -> web.Response:
        """POST /init_weights_update_group {master_address, master_port, rank_offset, world_size, group_name,
        backend}."""
        state = request.app[STATE_KEY]
        body = await json_body(request)
        try:
            group = await asyncio.to_thread(
                WeightGroup.join,
                str(body["master_address"]),
                int(body["master_port"]),
                int(body["rank_offset"]),
                int(body["world_size"]),
                str(body.get("backend", "nccl")),
                state.engine.model.device,
            )
        except KeyError as exc:
            raise EngineError(f"init_weights_update_group needs {exc.args[0]}") from exc
        except (RuntimeError, ValueError) as exc:
            return web.json_response({"success": False, "message": f"cannot join the weight group: {exc}"}, status=400)
        state.weight_groups[str(body.get("group_name", "weight_update_group"))] = group
        return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def update_from_distributed(request: web.Request) -> web.Response:
        """POST /update_weights_from_distributed {names, dtypes, shapes, group_name, weight_version}."""
        state = request.app[STATE_KEY]
        body = await json_body(request)
        group = state.weight_groups.get(str(body.get("group_name", "weight_update_group")))
        if group is None:
            raise EngineError("no weight update group: call /init_weights_update_group first")

        async def load() -> None:
            tensors = await asyncio.to_thread(
                receive_named, group, body.get("names") or [], body.get("dtypes") or [], body.get("shapes") or []
            )
            await state.engine.update_weights(tensors, version=state.engine.version)

        return await reply(state, load, body)

    async def destroy_group(request: web.Request) -> web.Response:
        """POST /destroy_weights_update_group {group_name}."""
        state = request.app[STATE_KEY]
        name = str((await json_body(request)).get("group_name", "weight_update_group"))
        if state.weight_groups.pop(name, None) is None:
            return web.json_response({"success": False, "message": f"no group {name}"}, status=400)
        return web.json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    app.router.add_post("/update_weights_from_tensor", handles_errors(update_from_tensor))
    app.router.add_post("/init_weights_update_group", handles_errors(init_group))
    app.router.add_post("/update_weights_from_distributed", handles_errors(update_from_distributed))
    app.router.add_post("/destroy_weights_update_group", handles_errors(destroy_group))
