"""What vLLM reads from disk: the model directory a server starts from, and the weights a push reloads.

The "tiny" model vLLM serves is tiny_llama(seed 0) with 2 attention heads (head_dim 32: vLLM's CPU attention
has no kernel for the default 16). Pushed state dicts go to /dev/shm as one safetensors file (in RAM, and the
server on this machine reads it), and a push is refused before it starts when its directory holds no
safetensors: vLLM's in-place reload, once started, leaves the model unusable if it fails.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envhub.errors import EngineError
from envhub.trainer.engines.vllm.command import TINY_HEADS, check_head_dim

SHM_DIR = Path("/dev/shm")


def served_model_dir(model: str) -> Path:
    """A directory vLLM can load for an envhub model name: "smollm2" (the cached safetensors copy), "tiny"
    (tiny_llama seed 0 with head_dim 32, exported once to the cache) or a local Hugging Face directory."""
    from envhub.trainer import models

    if model == "tiny":
        target = models.cache_root() / "models" / f"tiny-vllm-h64-n{TINY_HEADS}-s0"
        if not (target / "config.json").exists():
            tokenizer = models.load_tokenizer("tiny")
            models.save_model_dir(models.tiny_llama(tokenizer, seed=0, num_heads=TINY_HEADS), tokenizer, target)
    else:
        target = models.resolve_model_path(model)
    check_head_dim(json.loads((target / "config.json").read_text()), str(target))
    return target


def write_safetensors(state: Mapping[str, Any], root: Path = SHM_DIR) -> Path:
    """Write a state dict as one safetensors file in a fresh directory (in RAM under /dev/shm when it exists)."""
    from safetensors.torch import save_file

    base = root if root.is_dir() else Path(tempfile.gettempdir())
    directory = Path(tempfile.mkdtemp(prefix=f"envhub-weights-{os.getpid()}-", dir=base))
    save_file(plain_tensors(state), str(directory / "model.safetensors"))
    return directory


def plain_tensors(state: Mapping[str, Any]) -> dict[str, Any]:
    """A state dict as safetensors stores it: CPU, contiguous, no two names sharing storage (tied weights copied)."""
    tensors: dict[str, Any] = {}
    seen: set[int] = set()
    for name, tensor in state.items():
        data = tensor.detach().to("cpu").contiguous()
        if data.data_ptr() in seen:  # tied weights share storage; safetensors refuses duplicates
            data = data.clone()
        seen.add(data.data_ptr())
        tensors[name] = data
    return tensors


def check_weights_dir(path: Path) -> None:
    """EngineError unless `path` is a directory holding .safetensors files."""
    if not path.is_dir() or not any(path.glob("*.safetensors")):
        raise EngineError(
            f"{path} is not a directory of .safetensors files",
            hint="save the weights with save_pretrained(dir) or pass a state dict (written to /dev/shm)",
        )
