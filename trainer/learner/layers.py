"""Which weights learn: the top N decoder layers and the final norm, the rest frozen as loaded.

Training only the top of the network makes the backward pass stop there: on a CPU a SmolLM2-135M step over
the top 10 of 30 layers costs about half a full one (measured: 720 tokens, bf16 autocast, 1.1 s against 2.1 s).
The SFT warm start and the RL learner share this rule, so a demo's RL phase moves the layers its SFT moved.
"""

from __future__ import annotations

from typing import Any

import torch

from envhub.errors import ConfigError


def freeze_below_top_layers(model: Any, layers: int) -> list[torch.nn.Parameter]:
    """Freeze every parameter outside the top `layers` decoder layers and the final norm; returns those frozen.

    `layers <= 0` freezes nothing. A model without a `layers` stack of decoder blocks cannot be cut this way: the
    error names the model class and the setting to change.
    """
    if layers <= 0:
        return []
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    blocks = getattr(base, "layers", None)
    if blocks is None:
        raise ConfigError(
            f"train_layers={layers}: {type(model).__name__} has no stack of decoder layers to train the top of",
            hint="set train_layers: 0 to train every weight",
        )
    if layers > len(blocks):
        raise ConfigError(
            f"train_layers={layers} but the model has {len(blocks)} decoder layers",
            hint=f"use a value from 1 to {len(blocks)}, or 0 to train every weight",
        )
    norm = getattr(base, "norm", None)
    trained = {id(p) for block in list(blocks)[-layers:] for p in block.parameters()}
    trained |= {id(p) for p in (norm.parameters() if norm is not None else ())}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in trained]
    for p in frozen:
        p.requires_grad_(False)
    return frozen
