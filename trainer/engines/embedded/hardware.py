"""What the machine offers the embedded engine: its serving dtype, glibc's allocator settings, and OpenMP's
worker threads (see `envhub.trainer.engines.embedded.compute_thread` for why a thread gives its workers back)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
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

    The price is ~3,800 page faults (~12 ms) per 32-row SmolLM2 decode step, whose activations and logits are
    mapped and unmapped every step. A 32 MiB threshold (128 MiB trim) kept them on the heap and made the step
    78 ms instead of 90 on 2 cores, but in a training process the learner's activations then stayed in the
    heaps of its threads too: `make demo` grew past 24 GB in 5 minutes and was killed. Kept at 64 KiB.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt): nothing to fix
        return False


@functools.cache
def _gnu_openmp() -> Any:
    """torch's GNU OpenMP runtime when it is the one loaded in this process (Linux wheels), else None."""
    if not sys.platform.startswith("linux") or "OpenMP" not in torch.__config__.parallel_info():
        return None
    for path in sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp*.so*"))):
        try:  # RTLD_NOLOAD: only the copy torch already loaded, never a second runtime
            library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError:
            continue
        if hasattr(library, "omp_pause_resource_all"):
            return library
    return None


def release_openmp_workers() -> bool:
    """End the OpenMP worker threads this thread's parallel regions used (GNU OpenMP only); True when done.

    `omp_pause_resource_all` (OpenMP 5.0) frees the calling thread's team in libgomp: the process then counts
    fewer OpenMP threads, and while it holds no more of them than CPUs, idle workers of the teams that compute
    spin between regions instead of sleeping. A later parallel region on this thread starts a new team.
    """
    library = _gnu_openmp()
    if library is None:
        return False
    omp_pause_hard = 2
    return library.omp_pause_resource_all(omp_pause_hard) == 0
