"""Advantages and the per-token terms every policy-gradient variant shares, written as their equations: GRPO's
group-normalised advantages, masked means, clamped log-ratios, the k3 KL estimator and the loss diagnostics.
The losses themselves are in pg_variants.py.

Shape conventions: a batch holds B sequences padded to T tokens.
- `rewards`: [B], groups of `group_size` consecutive rows (row i belongs to group i // group_size).
- `logprobs`, `behavior_logprobs`, `proximal_logprobs`, `ref_logprobs`, `loss_mask`: [B, T], where
  position t holds the logprob of token t given tokens < t; `loss_mask` is 1 on model tokens only.
- `advantages`: [B] (one per sequence, broadcast over its tokens) or [B, T].
The loss is the token-level mean over every masked token in the batch (not a mean of per-sequence
means), so long answers are not down-weighted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from envhub.trainer.trajectory import Trajectory


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale_std: bool = True, eps: float = 1e-6, tol: float = 1e-6
) -> torch.Tensor:
    """A_i = (r_i - mean(group)) / (std(group) + eps), std division optional; shape [B].

    A group whose std is at most `tol` has no signal and gets exactly 0 (dividing float noise by
    std + eps would otherwise turn rewards equal up to rounding into advantages of about +-1).
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size={group_size} entries, got {tuple(rewards.shape)}"
        )
    grouped = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, unbiased=False, keepdim=True)
    if scale_std:
        centered = centered / (std + eps)
    return torch.where(std > tol, centered, torch.zeros_like(centered)).view(-1)


def sample_advantages(group: Sequence[Trajectory], scale_std: bool = True, tol: float = 1e-6) -> torch.Tensor:
    """One advantage per sample of `group` ([len(group)]): `group_advantages` over the group's episodes (one
    reward each, `episodes_of`), each handed to every sample of its episode. An episode that is one trajectory is
    one sample, so for the rollout's own groups this is `group_advantages` of their rewards."""
    from envhub.trainer.trajectory import episodes_of

    episodes = episodes_of(list(group))
    rewards = torch.tensor([episode[0].reward for episode in episodes])
    per_episode = group_advantages(rewards, len(episodes), scale_std=scale_std, tol=tol)
    index = {id(t): i for i, episode in enumerate(episodes) for t in episode}
    return per_episode[[index[id(t)] for t in group]]  # in the group's order, wherever an episode's samples sit


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is 1 (0 when the mask is empty; padding may hold inf / nan)."""
    mask = mask.to(values.dtype)
    return (torch.where(mask > 0, values, torch.zeros_like(values)) * mask).sum() / mask.sum().clamp(min=1.0)


# exp(20) ~ 5e8 (verl's bound): a log-ratio past it gives a finite weight and no gradient instead of inf / nan
LOG_RATIO_BOUND = 20.0


def log_ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """log(p / q) from logprobs, clamped to +-LOG_RATIO_BOUND; NaN stays NaN, gradient included (the learner's
    non-finite-gradient guard must see it)."""
    diff = numerator - denominator
    return torch.where(diff.isnan(), diff, diff.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(ref - lp) - (ref - lp) - 1 (always >= 0)."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


@dataclass(frozen=True)
class LossStats:
    """Diagnostics of one loss evaluation (floats, for metrics)."""

    clip_fraction: float
    approx_kl: float
    mean_ratio: float


@torch.no_grad()
def loss_stats(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> LossStats:
    """Fraction of masked tokens outside the clip range, k3 KL to the behaviour policy, mean ratio."""
    ratio = torch.exp(logprobs - behavior_logprobs)
    outside = ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)).float()
    return LossStats(
        clip_fraction=float(masked_mean(outside, loss_mask)),
        approx_kl=float(masked_mean(kl_k3(logprobs, behavior_logprobs), loss_mask)),
        mean_ratio=float(masked_mean(ratio, loss_mask)),
    )
