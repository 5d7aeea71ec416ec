"""AdamW over the trainable fp32 masters with linear warmup and a constant or cosine schedule."""

from __future__ import annotations

import math
from typing import Any

import torch

from envhub.trainer.config import AlgorithmConfig


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the base lr for optimizer step `step` (0-based): linear warmup, then constant or cosine to 0."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine" and total_steps > warmup_steps:
        progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def build_optimizer(
    params: Any, config: AlgorithmConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (fp32 state, since the params are fp32 masters) and its warmup/decay schedule."""
    trainable = [p for p in params if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, config.warmup_steps, total_steps, config.lr_schedule)
    )
    return optimizer, scheduler
