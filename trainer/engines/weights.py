"""Copy policy weights into a live model in place, from a state dict or a safetensors checkpoint directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from envhub.errors import EngineError


def read_state(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, or of every *.safetensors file in a directory."""
    from safetensors.torch import load_file

    path = Path(path).expanduser()
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        raise EngineError(
            f"no safetensors weights at {path}", hint="save the policy with save_pretrained() or safetensors"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def load_state(model: Any, path_or_state: str | Path | Mapping[str, torch.Tensor]) -> int:
    """Copy matching tensors into `model`'s parameters and buffers in place; returns how many were copied."""
    state = read_state(path_or_state) if isinstance(path_or_state, (str, Path)) else path_or_state
    targets = dict(model.named_parameters())
    targets.update(dict(model.named_buffers()))
    unknown = [name for name in state if name not in targets]
    if unknown:
        raise EngineError(
            f"weights do not match the served model: unknown tensors {unknown[:3]}", hint="same architecture?"
        )
    for name, tensor in state.items():  # check everything before touching the served model
        if targets[name].shape != tensor.shape:
            raise EngineError(
                f"shape mismatch for {name}: {tuple(tensor.shape)} vs served {tuple(targets[name].shape)}"
            )
    copied = 0
    with torch.no_grad():
        for name, tensor in state.items():
            targets[name].copy_(tensor)  # casts and moves in one pass, without a temporary copy
            copied += 1
    if not copied:
        raise EngineError("no tensors to load", hint="pass a non-empty state dict or checkpoint")
    return copied
