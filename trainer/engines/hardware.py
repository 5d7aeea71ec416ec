"""What the machine offers the embedded engine: its serving dtype, and a glibc setting that keeps CPU memory flat."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any

import torch

from envhub.errors import EngineError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (AMX tiles or AVX512-BF16), so bf16 beats fp32."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, probe, lambda: False)()) for probe in probes)


def engine_dtype(name: Any, device: Any) -> torch.dtype:
    """The dtype to serve in: "auto" is bf16 on CUDA with bf16 support and on CPUs with bf16 units, else fp32."""
    if isinstance(name, torch.dtype):
        return name
    kind = getattr(device, "type", str(device))
    if name in (None, "auto"):
        if kind == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if kind == "cpu" and cpu_has_fast_bf16() else torch.float32
    if name not in DTYPES:
        raise EngineError(f"engine dtype must be auto, float32 or bfloat16, got {name!r}")
    return DTYPES[name]


@functools.cache
def fix_malloc_mmap_threshold(threshold: int = 64 * 1024) -> bool:
    """Serve CPU tensors of `threshold` bytes or more from fresh mmaps (glibc only); True when applied.

    glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which KV-cache
    tensors of ever-changing sizes come from the heap, fragment it and are never returned: a multi-turn engine
    on CPU then grew by about 1 GB a minute with the live data flat. A fixed threshold disables that adjustment
    (as MALLOC_MMAP_THRESHOLD_ does), so freed tensors go back to the OS.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt): nothing to fix
        return False
