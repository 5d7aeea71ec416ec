"""Atomic checkpoints: HF-format model (sharded safetensors), optimizer, RNG, trainer state; strict resume.

A checkpoint is written into a temporary directory and renamed into place, then `latest` is replaced
atomically, so an interrupted save never leaves a half-written checkpoint behind `latest`; a save that cannot be
written (disk full, read-only or unwritable directory) removes its partial files and raises `CheckpointError`
naming the previous checkpoint, which it leaves as it was. Weights are
the fp32 masters (resume is exact); a LoRA run stores only its adapter. Loading reads every shard and
refuses missing or unknown tensors (only a tied output head may be absent, as save_pretrained drops it).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from envhub.errors import ConfigError, EnvhubError

ADAPTER_FILE = "adapter_model.safetensors"
DISK_FULL_BYTES = 1 << 20  # a filesystem with less free space than this after a failed write is full


class CheckpointError(EnvhubError):
    """A checkpoint that could not be written; the previous one is intact."""


@dataclass
class Checkpoint:
    """A saved training state on disk."""

    path: Path
    step: int
    state: dict[str, Any]


def rng_state() -> dict[str, Any]:
    """Every RNG a step draws from: torch CPU, CUDA (all devices, when present), Python's."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()` (CUDA only when both the checkpoint and this machine have it)."""
    torch.set_rng_state(state["torch"])
    if "python" in state:
        random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: str | Path,
    step: int,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    state: dict[str, Any],
    *,
    model_state: dict[str, torch.Tensor] | None = None,
    max_shard_size: str | int = "5GB",
    keep: int = 0,
) -> Path:
    """Write step `step` under root/checkpoints/ atomically, point root/latest at it, keep the newest `keep` (0 = all).

    `model_state` (full CPU tensors, e.g. gathered from FSDP shards or a LoRA adapter) replaces
    `model.state_dict()`; `optimizer` is an optimizer or its state dict. Safe to call from a thread.
    """
    root = Path(root)
    final = root / "checkpoints" / f"step_{step:06d}"
    tmp: Path | None = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".step_{step:06d}.", dir=final.parent))
        _write_files(tmp, model, tokenizer, optimizer, {**state, "step": step}, model_state, max_shard_size)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        tmp = None
        pointer = root / ".latest.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, root / "latest")
    except Exception as exc:  # OSError, or torch's and safetensors' own errors for a full disk
        cause = _cause(exc, final.parent)  # before the partial files go: a full disk is seen full
        for partial in (tmp, final if _latest_name(root) != final.name else None):
            if partial is not None:  # free the space the failed save took; `latest` still names the previous one
                shutil.rmtree(partial, ignore_errors=True)
        (root / ".latest.tmp").unlink(missing_ok=True)
        raise _save_error(root, step, cause) from exc
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep > 0:
        prune_checkpoints(root, keep)
    return final


def _write_files(
    tmp: Path,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    state: dict[str, Any],
    model_state: dict[str, torch.Tensor] | None,
    max_shard_size: str | int,
) -> None:
    """Every file of a checkpoint into `tmp`: weights, tokenizer, optimizer, RNG, trainer state."""
    if model_state is not None:
        model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True, max_shard_size=max_shard_size)
    else:
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size=max_shard_size)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save(optimizer if isinstance(optimizer, dict) else optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))


def _latest_name(root: Path) -> str:
    try:
        return (root / "latest").read_text().strip()
    except OSError:
        return ""


def _cause(exc: Exception, where: Path) -> str:
    """Why a save failed, in words: the OS error, or a full disk behind a writer's own error (torch.save reports
    ENOSPC as "enforce fail ... unexpected pos")."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    try:
        full = shutil.disk_usage(where).free < DISK_FULL_BYTES
    except OSError:
        full = False
    text = f"{type(exc).__name__}: {exc}"[:300]
    return f"No space left on device ({text})" if full else text


def _save_error(root: Path, step: int, cause: str) -> CheckpointError:
    """The one-line error of a save that could not be written, naming what is still there."""
    previous = _latest_name(root)
    kept = (
        f"the previous checkpoint {root / 'checkpoints' / previous} is intact"
        if previous
        else "there is no earlier checkpoint"
    )
    return CheckpointError(
        f"cannot write checkpoint step {step} under {root / 'checkpoints'}: {cause}; {kept}",
        hint=f"free space or fix the permissions of {root}, then resume with --resume",
    )


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` step directories (never the one `latest` names); returns the deleted."""
    root = Path(root)
    pointer = root / "latest"
    current = pointer.read_text().strip() if pointer.exists() else ""
    steps = sorted(p for p in (root / "checkpoints").glob("step_*") if p.is_dir())
    doomed = [p for p in steps[:-keep] if p.name != current] if keep > 0 else []
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def latest_checkpoint(root: str | Path) -> Checkpoint | None:
    """The checkpoint `latest` points at, or None when the run has none."""
    root = Path(root)
    pointer = root / "latest"
    if not pointer.exists():
        return None
    path = root / "checkpoints" / pointer.read_text().strip()
    state = json.loads((path / "trainer_state.json").read_text())
    return Checkpoint(path=path, step=int(state["step"]), state=state)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a HF model directory: all shards named by its index, or every *.safetensors file."""
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        absent = [f for f in files if not (path / f).exists()]
        if absent:
            raise ConfigError(
                f"checkpoint {path} lacks shards {absent[:3]} named by its index",
                hint="the copy is incomplete; resume from another",
            )
    else:
        files = sorted(p.name for p in path.glob("*.safetensors") if p.name != ADAPTER_FILE)
    if not files:
        raise ConfigError(f"checkpoint {path} has no safetensors weights", hint="delete it or resume from another")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(path / name)))
    return state


def tied_names(model: Any) -> set[str]:
    """State-dict names that alias an earlier tensor (a tied output head): save_pretrained may omit them."""
    seen: dict[int, str] = {}
    tied = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        ptr = tensor.data_ptr()
        if ptr in seen and tensor.numel():
            tied.add(name)
        seen.setdefault(ptr, name)
    return tied


def load_weights_strict(model: Any, state: dict[str, torch.Tensor], where: str = "checkpoint") -> None:
    """Copy `state` into `model`; any missing (other than a tied head), unknown or misshapen tensor is an error."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state) - tied_names(model))
    unknown = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(state) & set(expected) if tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or unknown or wrong:
        raise ConfigError(
            f"{where} does not match the model: missing {missing[:3]} ({len(missing)}), unknown {unknown[:3]} "
            f"({len(unknown)}), wrong shape {wrong[:3]}",
            hint="resume with the model the run was started with",
        )
    model.load_state_dict(state, strict=False)


def load_checkpoint(checkpoint: Checkpoint, model: Any, optimizer: Any) -> None:
    """Load weights (every shard, strictly), optimizer and RNG state of `checkpoint` in place."""
    from safetensors.torch import load_file

    adapter = checkpoint.path / ADAPTER_FILE
    if adapter.exists():
        if not hasattr(model, "peft_config"):
            raise ConfigError(
                f"checkpoint {checkpoint.path} holds a LoRA adapter but model.lora.r is 0",
                hint="resume with the run's model.lora",
            )
        from envhub.trainer.learner.lora import load_adapter_state

        load_adapter_state(model, load_file(str(adapter)))
    elif hasattr(model, "peft_config"):
        raise ConfigError(
            f"checkpoint {checkpoint.path} holds full weights but model.lora is set",
            hint="resume with the run's model.lora",
        )
    else:
        load_weights_strict(model, read_weights(checkpoint.path), f"checkpoint {checkpoint.path}")
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(checkpoint.path / "optimizer.pt", weights_only=False))
    set_rng_state(torch.load(checkpoint.path / "rng.pt", weights_only=False))
