"""How a state dict travels to SGLang servers: the fields of each bucket request, the tensors' device for CUDA
IPC, and the process group of a distributed push (the trainer's rank 0 and every server's ranks)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

from envhub.errors import EngineError


def bucket_fields(count: int, version: int | None, flush: bool, abort_all: bool) -> Iterator[dict[str, Any]]:
    """The update fields of each of `count` bucket requests: only the first aborts, only the last flushes and
    names the version (SGLang records a version change only when an update names a new one)."""
    for index in range(count):
        last = index == count - 1
        fields: dict[str, Any] = {"flush_cache": flush and last, "abort_all_requests": abort_all and index == 0}
        if last and version is not None:
            fields["weight_version"] = str(version)
        yield fields


def send_buckets(group: Any, buckets: Sequence[Any], flattened: bool) -> None:
    """Rank 0's side of a distributed update: broadcast each bucket in order."""
    for bucket in buckets:
        group.send(bucket, flattened)


def on_cuda(bucket: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The bucket's tensors on a CUDA device (SGLang opens them as CUDA IPC handles)."""
    import torch

    if all(t.is_cuda for _, t in bucket):
        return bucket
    if not torch.cuda.is_available():
        raise EngineError(
            "tensor_format sglang sends CUDA IPC handles, but the weights are on CPU and there is no GPU here",
            hint="use engine.weight_sync: disk (or tensor_format: safetensors for envhub serve-engine)",
        )
    return [(name, t.to("cuda", non_blocking=True)) for name, t in bucket]


async def join_weight_group(
    engines: Sequence[Any],
    master_address: str,
    master_port: int,
    backend: str,
    device: Any,
    group_name: str = "weight_update_group",
    timeout_s: float = 600.0,
) -> Any:
    """Form one process group: the trainer is rank 0, server i holds ranks 1 + sum(tp of servers before it) ...
    (world size 1 + every server's tp_size). Returns the trainer's weight_sync.WeightGroup."""
    from envhub.trainer.engines.weight_sync import WeightGroup

    offsets, world = [], 1
    for engine in engines:
        offsets.append(world)
        world += engine.tp_size
    trainer = asyncio.to_thread(
        WeightGroup.join, master_address, master_port, 0, world, backend, device, group_name, timeout_s
    )
    servers = [
        e.init_weights_update_group(master_address, master_port, offset, world, backend, group_name)
        for e, offset in zip(engines, offsets)
    ]
    results = await asyncio.gather(trainer, *servers)
    return results[0]
