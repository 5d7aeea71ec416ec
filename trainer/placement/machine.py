"""The machine a run is placed on: this one (its GPUs, their memory, its RAM) or one the user describes
(`--gpus N --gpu-memory-gib G`), and a short health probe of the engine servers a config attaches to."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from envhub.errors import ConfigError
from envhub.trainer.placement.memory import GIB


@dataclass(frozen=True)
class Machine:
    """GPUs, memory per GPU and host memory (bytes; 0 = unknown) of the machine a run is planned for."""

    gpus: int
    gpu_memory: int
    host_memory: int
    described: bool = False  #: planned for a machine the user described, not this one: local installs not checked

    def describe(self) -> str:
        gpus = f"{self.gpus} GPU(s) x {self.gpu_memory / GIB:.0f} GiB" if self.gpus else "no GPU"
        host = f"{self.host_memory / GIB:.0f} GiB host memory" if self.host_memory else "host memory not stated"
        return f"{'described' if self.described else 'this machine'}: {gpus}, {host}"


def _local_gpus() -> tuple[int, int]:
    """(GPUs visible here, memory of the smallest) without initialising more than torch's CUDA query."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        return 0, 0
    return count, min(torch.cuda.get_device_properties(i).total_memory for i in range(count))


def _local_host_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def machine_for(
    gpus: int | None = None,
    gpu_memory_gib: float | None = None,
    host_memory_gib: float | None = None,
    stated: Any = None,
) -> Machine:
    """The machine to place a run on. `gpus` and the memory figures (from the command line) win; then this machine's
    GPUs where it has CUDA; then the config's `machine:` section (`stated`), which on a machine without CUDA plans
    the run for the one it describes. Stated GPUs need their memory stated too."""
    for name, value in (("--gpus", gpus), ("--gpu-memory-gib", gpu_memory_gib), ("--host-memory-gib", host_memory_gib)):
        if value is not None and value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    local_count, local_memory = _local_gpus()
    if gpus is None:
        gpus = local_count or (stated.gpus if stated is not None else 0)
    if gpu_memory_gib is None and stated is not None and stated.gpu_memory_gib > 0:
        gpu_memory_gib = stated.gpu_memory_gib
    described = gpus > 0 and local_count == 0
    memory = int(gpu_memory_gib * GIB) if gpu_memory_gib else local_memory
    if gpus and not memory:
        raise ConfigError(
            f"the run is planned on {gpus} GPU(s) whose memory is not known here",
            hint="state it: --gpu-memory-gib 80 (an H100 / A100-80GB), 141 (H200), 24 (an L4 / RTX 4090), "
            "or machine.gpu_memory_gib in the config",
        )
    if host_memory_gib:
        host = int(host_memory_gib * GIB)
    else:
        host = 0 if described else _local_host_memory()
    return Machine(gpus, memory, host, described)


async def probe(urls: list[tuple[str, str]], api_key: str = "", timeout_s: float = 2.0) -> list[str]:
    """For each (base URL, health path): "" when it answers 200 within `timeout_s`, else what went wrong."""
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = aiohttp.ClientTimeout(total=timeout_s, sock_connect=timeout_s)

    async def one(session: Any, url: str, path: str) -> str:
        try:
            async with session.get(url + path, headers=headers, allow_redirects=False) as response:
                return "" if response.status == 200 else f"GET {path} answered {response.status}"
        except TimeoutError:
            return f"no answer to GET {path} within {timeout_s:g} s"
        except aiohttp.ClientError as exc:
            return f"cannot reach it ({type(exc).__name__})"
        except ValueError as exc:  # an URL aiohttp cannot parse
            return f"not a URL ({exc})"

    async with aiohttp.ClientSession(timeout=limit) as session:
        return list(await asyncio.gather(*(one(session, url, path) for url, path in urls)))
