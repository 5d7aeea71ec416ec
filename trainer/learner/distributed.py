"""The learner on N processes with torch.distributed: DDP, or FSDP2 `fully_shard`; rank 0 drives, the others follow.

Rank 0 runs the whole trainer (rollouts, queue, engine). Every learner call that needs all processes
(a step; gathering full weights under FSDP) is first announced to the followers with one
`broadcast_object_list`, then run by every rank on the same groups: each takes every N-th micro-batch
of the step's plan, gradients are averaged by DDP / reduce-scattered by FSDP, and every rank applies
the same optimizer step. Processes come from `torchrun` (detected by its RANK / WORLD_SIZE variables)
or are started here with torch.multiprocessing (spawn) when `learner.devices` > 1.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from envhub.errors import ConfigError
from envhub.trainer.learner.precision import resolve_device

FOLLOWER_CALLS = {
    "step": "local_step",
    "engine_state": "local_engine_state",
    "checkpoint_state": "local_checkpoint_state",
    "broadcast_state": "local_broadcast_state",
    "load_sharded": "local_load_sharded",
}


@dataclass
class DistLearner:
    """This process's place in the learner group and the strategy-specific pieces of a step."""

    rank: int
    world: int
    strategy: str
    device: torch.device
    processes: list[Any] = field(default_factory=list)  #: followers this process started (rank 0 without torchrun)

    def wrap(self, scorer: torch.nn.Module) -> torch.nn.Module:
        """The logprob module under DDP or FSDP2, starting from rank 0's weights on every rank."""
        with torch.no_grad():
            for tensor in list(scorer.parameters()) + list(scorer.buffers()):
                dist.broadcast(tensor.data, src=0)
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            # a micro-batch whose tokens were all dropped as stale uses no head: tolerate unused parameters
            return DistributedDataParallel(scorer, device_ids=ids, find_unused_parameters=True)
        from torch.distributed.fsdp import fully_shard  # FSDP2; runs on gloo (CPU) as well as NCCL

        for layer in _decoder_layers(scorer.model):
            fully_shard(layer)
        fully_shard(scorer)
        return scorer

    def sync(self, scorer: Any, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Accumulate gradients locally until the step's last micro-batch, then reduce once."""
        if self.strategy == "ddp":
            return contextlib.nullcontext() if last else scorer.no_sync()
        scorer.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def all_reduce(self, values: torch.Tensor) -> torch.Tensor:
        """Sum of `values` over the learner processes."""
        on_device = values.to(self.device)
        dist.all_reduce(on_device)
        return on_device.cpu()

    def command(self, name: str, *args: Any) -> None:
        """Rank 0 announces a collective learner call to the followers."""
        if self.rank == 0:
            dist.broadcast_object_list(
                [(name, args)], src=0, device=self.device if self.device.type == "cuda" else None
            )

    def full_model_state(self, model: Any) -> dict[str, torch.Tensor]:
        """Unsharded CPU weights (a collective under FSDP)."""
        if self.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def full_optimizer_state(self, model: Any, optimizer: Any) -> dict[str, Any]:
        """Unsharded optimizer state (a collective under FSDP)."""
        if self.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            full = get_optimizer_state_dict(
                model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            if "param_groups" not in full:  # with cpu_offload only rank 0 receives the gathered state
                return full
            # keyed by parameter name; re-key by position as torch.optim does, so any strategy can resume from it
            index = {name: i for i, name in enumerate(n for group in full["param_groups"] for n in group["params"])}
            return {
                "state": {index[name]: value for name, value in full["state"].items()},
                "param_groups": [
                    {**group, "params": [index[n] for n in group["params"]]} for group in full["param_groups"]
                ],
            }
        return copy.deepcopy(optimizer.state_dict())

    def shutdown(self) -> None:
        """Release the followers and leave the process group."""
        if not dist.is_initialized():
            return
        if self.rank == 0:
            self.command("stop")
        for process in self.processes:
            process.join(timeout=60)
        dist.destroy_process_group()


def _decoder_layers(model: Any) -> list[torch.nn.Module]:
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(inner, inner.base_model_prefix)
    return list(getattr(body, "layers", []))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _uses_cuda(config: Any) -> bool:
    """Whether the learner runs on GPUs (nccl): model.device "cuda", or "auto" where CUDA is present ("cpu" = gloo)."""
    return resolve_device(config.model.device).type == "cuda"


def _backend_and_device(local_rank: int, cuda: bool) -> tuple[str, torch.device]:
    if cuda:
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) set this process's rank and world size."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1


def start_learner_processes(config: Any) -> DistLearner | None:
    """Join (torchrun) or create (spawn) the learner group for `config.learner`; None for one process."""
    strategy = config.learner.strategy
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        backend, device = _backend_and_device(int(os.environ.get("LOCAL_RANK", rank)), _uses_cuda(config))
        dist.init_process_group(backend)
        return DistLearner(rank, world, strategy, device)
    world = config.learner.devices
    if world <= 1:
        return None
    if _uses_cuda(config) and torch.cuda.device_count() < world:
        raise ConfigError(
            f"learner.devices is {world} but only {torch.cuda.device_count()} GPUs are visible",
            hint="lower learner.devices, set CUDA_VISIBLE_DEVICES, or set model.device: cpu for gloo processes",
        )
    from envhub.trainer.config import config_to_dict

    address = f"tcp://127.0.0.1:{_free_port()}"
    context = torch.multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_follower_main, args=(rank, world, address, config_to_dict(config)), daemon=True)
        for rank in range(1, world)
    ]
    for process in processes:
        process.start()
    backend, device = _backend_and_device(0, _uses_cuda(config))
    dist.init_process_group(backend, init_method=address, rank=0, world_size=world)
    return DistLearner(0, world, strategy, device, processes)


def follow(learner: Any) -> None:
    """A follower's loop: run each call rank 0 announces until it says stop."""
    from envhub.trainer.learner.step import LogprobMismatch

    assert learner.dist is not None
    while True:
        message: list[Any] = [None]
        dist.broadcast_object_list(
            message, src=0, device=learner.dist.device if learner.dist.device.type == "cuda" else None
        )
        name, args = message[0]
        if name == "stop":
            return
        try:
            getattr(learner, FOLLOWER_CALLS[name])(*args)
        except LogprobMismatch:  # rank 0 measured the same all-reduced KL, reports it and sends stop
            continue


def run_follower(config: Any, group: DistLearner) -> None:
    """Build this rank's copy of the learner exactly as rank 0 does and follow rank 0's calls."""
    from envhub.trainer.learner.step import Learner
    from envhub.trainer.models import build_policy

    model, tokenizer = build_policy(config.model, config.seed)
    try:
        follow(Learner.from_config(config, model, tokenizer, group))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _follower_main(rank: int, world: int, address: str, config_data: dict[str, Any]) -> None:
    from envhub.trainer.config import config_from_dict

    config = config_from_dict(config_data)
    backend, device = _backend_and_device(rank, _uses_cuda(config))
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world)
    run_follower(config, DistLearner(rank, world, config.learner.strategy, device))
