"""Where an engine kind's processes run, as `envhub train --dry-run` shows them: each kind says it
(`EngineKind.processes`) and whether its launcher could start it here (`EngineKind.check_launch`); the memory
arithmetic and the refusals live in `trainer/placement/`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Where = Literal["trainer", "local", "remote"]


@dataclass(frozen=True)
class EngineProcess:
    """One engine process of a run: in the trainer's own process, a server the run starts on this machine, or one
    it attaches to by URL."""

    name: str
    where: Where
    gpus: tuple[int, ...] = ()  #: this machine's GPUs it uses (a launched server; the learner's for in-process)
    tp: int = 1  #: GPUs its weights are split over
    memory_fraction: float = 0.0  #: share of each GPU it claims (SGLang's mem_fraction_static); 0 = weights + KV
    kv_budget_bytes: int = 0  #: its configured KV cache (0 = whatever the memory fraction leaves)
    dtype_bytes: int = 2  #: its weights' and KV cache's dtype size
    url: str = ""
    health_path: str = "/health"  #: GET here answers 200 on a healthy server (attached servers are probed)
    holds_weights: bool = True  #: False for a router
    on_host: bool = False  #: runs in host memory (a CPU build) even on a machine with GPUs
    static_rows: int = 0  #: a KV cache allocated once as this many equal rows (the embedded engine's CUDA graphs)
    static_bytes: int = 0  #: the bytes those rows share
    packed_weights: bool = False  #: holds a second, oneDNN-packed copy of its weights (embedded engine, CPU bf16)
    note: str = ""


def attached(urls: str, name: str, health_path: str, dtype_bytes: int = 2) -> list[EngineProcess]:
    """One remote process per comma-separated URL."""
    found = [u.strip().rstrip("/") for u in urls.split(",") if u.strip()]
    return [
        EngineProcess(f"{name}-{i}" if len(found) > 1 else name, "remote", url=u, health_path=health_path,
                      dtype_bytes=dtype_bytes)
        for i, u in enumerate(found)
    ]  # fmt: skip
