"""Mixed precision: fp32 master weights and optimizer state, bf16 autocast for compute, casts only at the edges.

An AdamW step moves a weight by about `lr` (1e-5 .. 1e-6), far below bf16's resolution (|w| / 256), so
weights and optimizer state stay fp32 and only the matmuls run in bf16 (autocast). The engine's dtype is
applied when weights leave the learner: pushed to an engine or exported for serving.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from envhub.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """Where the learner runs and in which dtypes: masters are always fp32."""

    device: torch.device
    compute_dtype: torch.dtype  #: autocast dtype of forward/backward (fp32 = no autocast)
    engine_dtype: torch.dtype  #: dtype of weights pushed to engines and exported

    @property
    def master_dtype(self) -> torch.dtype:
        """Parameters and optimizer state: fp32, so lr-sized updates are not rounded away."""
        return torch.float32

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for forward passes: bf16 autocast, or nothing for fp32."""
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)


def resolve_device(device: str = "auto") -> torch.device:
    """The torch device for a `model.device` value: "auto" is CUDA where present, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_precision(device: str = "auto", dtype: str = "auto") -> Precision:
    """Precision for `model.device` / `model.dtype` config values; fp16 is refused with the fix."""
    dev = resolve_device(device)
    if dtype == "auto":
        chosen = torch.bfloat16 if dev.type == "cuda" else torch.float32
    elif dtype in ("float16", "fp16", "half"):
        raise ConfigError(
            "model.dtype float16 is not supported for training: fp16 gradients underflow without a loss scaler",
            hint="use model.dtype: bfloat16 (fp32 master weights, bf16 compute) or float32",
        )
    elif dtype in DTYPES:
        chosen = DTYPES[dtype]
    else:
        raise ConfigError(f"model.dtype must be auto, float32 or bfloat16, got {dtype!r}")
    return Precision(device=dev, compute_dtype=chosen, engine_dtype=chosen)


def cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors of `state` in `dtype` (integer buffers untouched), detached."""
    return {name: (t.detach().to(dtype) if t.is_floating_point() else t.detach()) for name, t in state.items()}


def export_weights(
    model: Any,
    path: str | Path,
    dtype: torch.dtype,
    state: dict[str, torch.Tensor] | None = None,
    max_shard_size: str | int = "5GB",
) -> Path:
    """Write a Hugging Face model directory whose tensors (and config dtype) are `dtype`."""
    path = Path(path)
    state = cast_state(state if state is not None else dict(model.state_dict()), dtype)
    model.save_pretrained(path, state_dict=state, safe_serialization=True, max_shard_size=max_shard_size)
    config_file = path / "config.json"
    if config_file.exists():  # the in-memory config says fp32 (the masters); servers should load `dtype`
        config = json.loads(config_file.read_text())
        name = str(dtype).removeprefix("torch.")
        config.update({key: name for key in ("torch_dtype", "dtype") if key in config} or {"torch_dtype": name})
        config_file.write_text(json.dumps(config, indent=2))
    return path


def check_fp32_masters(model: Any) -> None:
    """Raise when a trainable parameter is not fp32 (a bf16 master would silently lose updates)."""
    for name, param in model.named_parameters():
        if param.requires_grad and param.dtype != torch.float32:
            raise ConfigError(
                f"trainable parameter {name} is {param.dtype}, not fp32",
                hint="load the policy in float32 and let autocast run bf16 compute",
            )
