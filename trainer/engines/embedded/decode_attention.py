"""The embedded engine's CPU decode attention: a small C kernel (kernels/decode_attention.c) built once per machine
with the system's C compiler and called through ctypes; SDPA where it cannot be used.

Why: in a CPU decode step, attention is the largest single part (42-44 ms of ~115 on one thread of a 2-vCPU EPYC,
SmolLM2-135M, 32 rows x ~320 keys), and ATen's flash kernel takes as long in bf16 as in fp32 there although it
reads half the bytes: with one query token per row and 3 queries per KV head, its time goes to per-(row, head) set-up.
The kernel reads each row's keys and values once per KV head for the head's whole query group, accumulates in fp32
with an online softmax, and allocates nothing. Figures: docs/engines.md, "Decode attention".

Build: `cc -O3 -march=native -fopenmp -shared` into `$ENVHUB_CACHE/kernels/` (default ~/.cache/envhub), named by a
hash of the source, the compiler's version and the CPU's flags, so a machine builds it once (~3 s) and a copy of the
cache on another CPU builds its own. The library's OpenMP calls resolve to the libgomp torch already loaded (same
soname), so its threads are torch's intra-op threads, sized by the caller (the engine's thread rule).

Used when: CPU tensors, float32 or bfloat16, AVX-512 at build time, head_dim a multiple of 16 up to 256, at most 16
queries per KV head. Otherwise, or when no compiler is found or the build fails, `load()` returns None and
`unavailable_reason()` says why; the runner then uses SDPA, as it does on CUDA. `ENVHUB_DECODE_ATTENTION=sdpa`
turns the kernel off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "kernels" / "decode_attention.c"
ABI = 1  # envhub_decode_attention_abi() of the source this module was written against
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared"]
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
MAX_GROUP, MAX_DIM = 16, 256
SWITCH = "ENVHUB_DECODE_ATTENTION"  # "sdpa": never use the kernel

_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_ARGTYPES = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _I64, _PTR, _I64, _PTR, _INT, _INT, _INT, _INT, ctypes.c_float,
             _INT, _INT]  # fmt: skip


class DecodeAttention:
    """The loaded kernel. Call with q [rows, kv_heads, group, head_dim] (innermost contiguous), one layer's cache
    `keys`/`values` [slots, kv_heads, capacity, head_dim] (contiguous), `lengths` [rows] int64 (keys attended per row,
    the new token's own included), returns [rows, kv_heads, group, head_dim] in q's dtype."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self._run = library.envhub_decode_attention
        self._run.argtypes = _ARGTYPES
        self._run.restype = _INT

    def supports(self, q: torch.Tensor, keys: torch.Tensor) -> bool:
        """Whether these tensors are ones the kernel takes (device, dtype, shape, layout)."""
        return (
            q.device.type == "cpu"
            and q.dtype in DTYPES
            and keys.dtype == q.dtype
            and q.dim() == 4
            and keys.dim() == 4
            and q.shape[1] == keys.shape[1]
            and q.shape[3] == keys.shape[3]
            and 1 <= q.shape[2] <= MAX_GROUP
            and q.shape[3] % 16 == 0
            and 16 <= q.shape[3] <= MAX_DIM
            and q.stride(3) == 1
            and keys.is_contiguous()
        )

    def __call__(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float
    ) -> torch.Tensor:
        if not self.supports(q, keys) or values.shape != keys.shape or not values.is_contiguous():
            raise ValueError(f"decode attention cannot take q {tuple(q.shape)} {q.dtype} with keys {tuple(keys.shape)}")
        rows, heads, group, dim = q.shape
        if lengths.dtype != torch.int64 or lengths.shape != (rows,) or not lengths.is_contiguous():
            lengths = lengths.to(torch.int64).contiguous()
        out = torch.empty((rows, heads, group, dim), dtype=q.dtype)
        status = self._run(
            q.data_ptr(), q.stride(0), q.stride(1), q.stride(2),
            keys.data_ptr(), values.data_ptr(), keys.stride(0), keys.stride(1),
            lengths.data_ptr(), keys.shape[2], out.data_ptr(),
            rows, heads, group, dim, float(scale), DTYPES[q.dtype], torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"decode attention refused q {tuple(q.shape)} (status {status})")
        return out


def cache_dir() -> Path:
    from envhub.trainer.models import cache_root

    return cache_root() / "kernels"


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _key(compiler: str) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), version.encode(), _cpu_flags().encode(), " ".join(FLAGS).encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def build(directory: Path | None = None) -> Path:
    """The kernel's shared library for this machine, compiled unless already there. Raises RuntimeError naming the
    cause and the fix when it cannot be built."""
    named = _compiler()
    compiler = shutil.which(named) if named else None
    if compiler is None:
        raise RuntimeError(
            f"no C compiler found ({named if named else 'cc, gcc or $CC'}): install gcc (apt-get install gcc) or "
            "set $CC"
        )
    directory = directory or cache_dir()
    target = directory / f"decode_attention-{_key(compiler)}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:  # concurrent builders each rename a whole file
        partial = Path(scratch) / target.name
        result = subprocess.run(
            [compiler, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{compiler} could not build {SOURCE.name} (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[-400:]}"
            )
        os.replace(partial, target)
    return target


@functools.cache
def _load() -> tuple[DecodeAttention | None, str | None]:
    if os.environ.get(SWITCH, "").strip().lower() == "sdpa":
        return None, f"{SWITCH}=sdpa"
    if platform.system() != "Linux":
        return None, f"the kernel is built for Linux only (this is {platform.system()})"
    try:
        path = build()
        library = ctypes.CDLL(str(path))
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        return None, str(error)
    if library.envhub_decode_attention_abi() != ABI:
        return None, f"{path} is not the kernel this envhub expects (ABI {ABI}): delete it to rebuild"
    if not library.envhub_decode_attention_vectorized():
        return None, "this CPU (or compiler) has no AVX-512: SDPA is used"
    return DecodeAttention(library, path), None


def load() -> DecodeAttention | None:
    """The kernel, built and loaded once per process; None where it cannot be used (see `unavailable_reason`)."""
    return _load()[0]


def unavailable_reason() -> str | None:
    """Why `load()` returns None, or None when the kernel is in use."""
    return _load()[1]
