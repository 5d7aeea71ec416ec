"""Weights from the learner to SGLang-protocol servers without a disk round trip, in SGLang 0.5.23's formats.

- Tensor payloads (`/update_weights_from_tensor`): SGLang's `MultiprocessingSerializer` format, the base64 of a
  `ForkingPickler` dump, **one entry per TP rank, each serialised separately** (rank r unpickles entry r; one
  pickle per rank keeps CUDA IPC reference counts and one-shot fd handles right). CUDA tensors travel as CUDA IPC
  handles that name their device by UUID (SGLang's patched reducer does the same), so a server that numbers its
  GPUs differently still opens them; the sender must keep the tensors alive until the request returns. CPU
  tensors travel as file descriptors, which only a process sharing our multiprocessing auth key can fetch: a real
  server needs CUDA tensors. `flattened=True` packs a bucket into one uint8 tensor plus metadata (SGLang's
  `flattened_bucket` load format: one IPC handle per bucket instead of one per tensor). envhub serve-engine takes
  base64 safetensors instead, because unpickling a client's bytes would run its code.
- Buckets: a state dict is cut into buckets of at most `bucket_bytes`, one request each.
- Process group (`/init_weights_update_group`): built exactly as SGLang's `init_custom_process_group` builds it
  (TCP rendezvous store, `PrefixStore(group_name)`, torch's group helper adding `group_name/` and device
  prefixes), so the trainer's rank 0 and the servers' ranks find the same keys. Broadcasts go in list order.
"""

from __future__ import annotations

import base64
import datetime
import io
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from envhub.errors import EngineError

Named = list[tuple[str, torch.Tensor]]
# Position of the device index among the arguments torch's CUDA tensor reducer returns (SGLang patches the same).
_DEVICE_ARG = 6


def plan_buckets(named: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[Named]:
    """Consecutive tensors grouped into buckets of at most `bucket_bytes` (a larger tensor goes alone); inside a
    bucket wider dtypes come first, so every tensor of a flattened bucket starts at an aligned byte offset."""
    if bucket_bytes <= 0:
        raise EngineError(f"bucket size must be positive, got {bucket_bytes} bytes")
    buckets: list[Named] = []
    size = 0
    for name, tensor in named.items():
        nbytes = tensor.numel() * tensor.element_size()
        if not buckets or (size + nbytes > bucket_bytes and buckets[-1]):
            buckets.append([])
            size = 0
        buckets[-1].append((name, tensor))
        size += nbytes
    return [sorted(bucket, key=lambda item: -item[1].element_size()) for bucket in buckets]


def flatten(bucket: Named) -> tuple[torch.Tensor, list[types.SimpleNamespace]]:
    """One uint8 tensor holding every tensor of `bucket` back to back, and SGLang's per-tensor metadata."""
    parts, metadata, offset = [], [], 0
    for name, tensor in bucket:
        raw = tensor.detach().contiguous().flatten().view(torch.uint8)
        parts.append(raw)
        # SimpleNamespace: SGLang reads these fields by attribute and its unpickler allows the type.
        metadata.append(
            types.SimpleNamespace(
                name=name,
                shape=tensor.shape,
                dtype=tensor.dtype,
                start_idx=offset,
                end_idx=offset + raw.numel(),
                numel=raw.numel(),
            )
        )
        offset += raw.numel()
    return torch.cat(parts), metadata


def torch_dtype(name: Any) -> torch.dtype:
    """`getattr(torch, name)` as SGLang resolves dtype strings, refusing anything that is not a dtype."""
    value = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(value, torch.dtype):
        raise EngineError(f"unknown dtype {name!r}", hint="use a torch dtype name such as bfloat16 or float32")
    return value


def unflatten(flat: torch.Tensor, names: Sequence[str], dtypes: Sequence[Any], shapes: Sequence[Any]) -> Named:
    """The tensors of a flattened bucket, laid out as SGLang's `FlattenedTensorBucket.empty` lays them out."""
    out, offset = [], 0
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        dtype = torch_dtype(dtype)
        size = torch.Size(int(s) for s in shape)
        if any(dim < 0 for dim in size):
            raise EngineError(f"negative dimension in tensor {name}: {list(size)}")
        if offset % dtype.itemsize:
            raise EngineError(f"unaligned tensor {name}: byte offset {offset}, dtype {dtype}")
        nbytes = size.numel() * dtype.itemsize
        out.append((name, flat[offset : offset + nbytes].view(dtype).view(size)))
        offset += nbytes
    if offset != flat.numel():
        raise EngineError(f"flattened bucket holds {flat.numel()} bytes, the metadata describes {offset}")
    return out


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


def with_device_uuid(args: tuple, uuid_of: Callable[[int], str]) -> tuple:
    """A CUDA tensor's reducer arguments with the device index replaced by that device's UUID."""
    return (*args[:_DEVICE_ARG], uuid_of(args[_DEVICE_ARG]), *args[_DEVICE_ARG + 1 :])


def _cuda_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def _dumps(obj: Any) -> bytes:
    """`MultiprocessingSerializer.serialize(obj)`: a ForkingPickler dump, CUDA devices named by UUID."""
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing import reductions  # importing it registers the tensor reductions

    class Pickler(ForkingPickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                rebuild, args = reductions.reduce_tensor(obj)
                return rebuild, with_device_uuid(args, _cuda_uuid)
            return NotImplemented

    buffer = io.BytesIO()
    Pickler(buffer).dump(obj)
    return buffer.getvalue()


def encode_sglang(named: Mapping[str, torch.Tensor] | Named, tp_size: int = 1, *, flattened: bool = False) -> list[str]:
    """One bucket as SGLang's `serialized_named_tensors`: `tp_size` base64 pickles, each serialised on its own;
    the object is `[(name, tensor), ...]` (load_format null) or, flattened, `{flattened_tensor, metadata}`."""
    items = list(named.items()) if isinstance(named, Mapping) else list(named)
    if flattened:
        flat, metadata = flatten(items)
        obj: Any = {"flattened_tensor": flat, "metadata": metadata}
    else:
        obj = [(name, tensor.detach()) for name, tensor in items]
    return [base64.b64encode(_dumps(obj)).decode() for _ in range(tp_size)]


def custom_process_group(
    master_address: str, master_port: int, rank: int, world_size: int, backend: str, group_name: str, timeout_s: float
) -> Any:
    """A process group made the way SGLang's `init_custom_process_group` makes it (rank 0 hosts the store)."""
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    if backend not in ("nccl", "gloo"):
        raise EngineError(f"backend must be nccl or gloo, got {backend!r}")
    if not group_name:
        raise EngineError("group_name must not be empty")
    timeout = datetime.timedelta(seconds=timeout_s)
    host = f"[{master_address}]" if ":" in master_address else master_address
    store, rank, world_size = next(rendezvous(f"tcp://{host}:{int(master_port)}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    group, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), store, group_name=group_name, backend_options=None, timeout=timeout
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


@dataclass
class WeightGroup:
    """One side of an `/init_weights_update_group` process group."""

    group: Any
    rank: int
    world_size: int
    device: torch.device
    name: str = "weight_update_group"

    @classmethod
    def join(
        cls,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        device: torch.device,
        group_name: str = "weight_update_group",
        timeout_s: float = 600.0,
    ) -> WeightGroup:
        """Join (rank 0: host) the group; blocks until all `world_size` ranks have joined."""
        if not 0 <= rank < world_size:
            raise EngineError(f"rank {rank} is outside a group of {world_size}")
        group = custom_process_group(master_address, master_port, rank, world_size, backend, group_name, timeout_s)
        return cls(group, rank, world_size, device, group_name)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Broadcast from rank 0 into `tensor` (in place on the receivers)."""
        dist.broadcast(tensor, src=0, group=self.group)
        return tensor

    def send(self, bucket: Named, flattened: bool) -> None:
        """Rank 0: broadcast one bucket, as one flat tensor or tensor by tensor in list order."""
        if flattened:
            self.broadcast(flatten([(n, t.to(self.device)) for n, t in bucket])[0])
            return
        for _, tensor in bucket:
            self.broadcast(tensor.detach().to(self.device).contiguous())

    def close(self) -> None:
        """Leave the group (its name can be joined again)."""
        dist.destroy_process_group(self.group)


def tensor_sizes(names: Any, dtypes: Any, shapes: Any) -> list[tuple[torch.dtype, torch.Size]]:
    """The (dtype, shape) of each tensor an update announces; EngineError for malformed metadata."""
    if not all(isinstance(x, list) for x in (names, dtypes, shapes)) or not names:
        raise EngineError("names, dtypes and shapes must be non-empty lists")
    if not len(names) == len(dtypes) == len(shapes):
        raise EngineError("names, dtypes and shapes must have the same length")
    out = []
    for name, dtype, shape in zip(names, dtypes, shapes):
        if not isinstance(name, str) or not isinstance(shape, list):
            raise EngineError(f"bad tensor metadata for {name!r}: names are strings, shapes lists of integers")
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise EngineError(f"shape of {name} must be non-negative integers, got {shape}")
        out.append((torch_dtype(dtype), torch.Size(shape)))
    return out


def receive_named(
    group: WeightGroup, names: list[str], dtypes: list[str], shapes: list[list[int]], load_format: str | None = None
) -> Named:
    """Receive one bucket rank 0 broadcasts (`/update_weights_from_distributed`), as SGLang's receiver does."""
    sizes = tensor_sizes(names, dtypes, shapes)
    if load_format == "flattened_bucket":
        total = sum(size.numel() * dtype.itemsize for dtype, size in sizes)
        flat = group.broadcast(torch.empty(total, dtype=torch.uint8, device=group.device))
        return unflatten(flat, names, dtypes, shapes)
    if load_format is not None:
        raise EngineError(f"unknown load_format {load_format!r}", hint="use null or flattened_bucket")
    out, handles = [], []
    for name, (dtype, size) in zip(names, sizes):
        tensor = torch.empty(size, dtype=dtype, device=group.device)
        handles.append(dist.broadcast(tensor, src=0, group=group.group, async_op=True))  # all posted, then waited
        out.append((name, tensor))
    for handle in handles:
        handle.wait()
    return out
