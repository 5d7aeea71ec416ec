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
def fix_malloc_mmap_threshold(threshold: int = 2 * 1024 * 1024) -> bool:
    """Serve CPU tensors of `threshold` bytes or more from fresh mmaps (glibc only); True when applied.

    glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which KV-cache
    tensors of ever-changing sizes come from the heap, fragment it and are never returned: a multi-turn engine
    on CPU then grew by about 1 GB a minute with the live data flat. A fixed threshold disables that adjustment
    (as MALLOC_MMAP_THRESHOLD_ does), so freed tensors of that size or more go back to the OS.

    Where to fix it, on a 2-core EPYC:
    - 32 MiB (128 MiB trim): the learner's activations stayed in its threads' heaps and `make demo` grew past 24 GB
      in 5 minutes and was killed.
    - 64 KiB (until 2026-12-02): every MLP activation, the logits and the sampling buffers were mapped and unmapped
      each step, with a page fault per 4 KiB touched: 76 M faults and 269 s of kernel time in one `make demo`
      (sync, 1,203 CPU s in all).
    - 2 MiB (2026-12-02): one decode step of 32 rows x 400 tokens 379 -> 264 ms (`benchmarks/engine_profile.py`,
      2 threads; faults 9.1 M -> 2.3 M; at 8 rows 62 ms either way). `make demo`, one run: 24 RL steps at 19.8 s,
      where runs at 64 KiB fitted 16 at 32-33 s (async the day before, sync that day); its evaluation 60 s instead
      of 78-79; 132 s of kernel time. Its peak RSS 10.5 GB against 7.9-8.1 GB in two runs at 64 KiB, flat through
      RL (9.4-9.7 GB) and 6-7 GB after it. KV caches and the learner's activations at the demo's sizes are larger
      than 2 MiB and still mapped.
    """
    libc = _glibc()
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold)) if libc is not None else False


@functools.cache
def _glibc() -> Any:
    """glibc, or None elsewhere (musl has neither mallopt nor malloc_trim: nothing to fix there)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def trim_heap() -> bool:
    """Give the free pages inside glibc's heaps back to the OS (`malloc_trim(0)`, every arena); True if any were.

    Blocks under the mmap threshold are freed into the heaps, whose free space between live blocks stays resident:
    in `benchmarks/engine_memory.py` (16 SmolLM2 conversations, 4 turns each) at a 2 MiB threshold, RSS less the
    KV and prefix caches went 973 -> 1,065 MB from 40 s to 280 s without this, 991 -> 1,029 MB with it every
    128 steps (one run each, 5-6 minutes; at 64 KiB it was 684 -> 704 MB over 9 minutes). The engine calls it
    every `TRIM_EVERY_STEPS` steps.
    """
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


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
