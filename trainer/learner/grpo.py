"""GRPO: group-normalised advantages and the PPO-clip policy loss, written as their equations.

Shape conventions: a batch holds B sequences padded to T tokens.
- `rewards`: [B], groups of `group_size` consecutive rows (row i belongs to group i // group_size).
- `logprobs`, `behavior_logprobs`, `proximal_logprobs`, `ref_logprobs`, `loss_mask`: [B, T], where
  position t holds the logprob of token t given tokens < t; `loss_mask` is 1 on model tokens only.
- `advantages`: [B] (one per sequence, broadcast over its tokens) or [B, T].
The loss is the token-level mean over every masked token in the batch (not a mean of per-sequence
means), so long answers are not down-weighted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    grouped = rewards.float().view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, unbiased=False, keepdim=True)
    if scale_std:
        centered = centered / (std + eps)
    return torch.where(std > tol, centered, torch.zeros_like(centered)).view(-1)


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


def policy_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    *,
    proximal_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Token-mean PPO-clip loss with clip-higher, optional decoupled IS correction and k3 KL.

    The learner computes its loss with pg_variants.pg_token_loss; its default ("ppo") equals this function bit for
    bit (tests/trainer/learner/test_pg_variants.py), which stays as that check's reference.

    ratio = exp(lp - anchor), anchor = behaviour logprobs (or `proximal_logprobs` when given);
    per-token loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A).
    With `proximal_logprobs` (decoupled PPO for stale samples), each token's loss is weighted by
    exp(proximal - behaviour), truncated at `tis_cap`. With `ref_logprobs`, kl_coef * k3 is added.
    """
    if advantages.ndim == 1:
        advantages = advantages.unsqueeze(1)
    anchor = behavior_logprobs if proximal_logprobs is None else proximal_logprobs
    ratio = torch.exp(logprobs - anchor)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    if proximal_logprobs is not None:
        weight = torch.exp(proximal_logprobs - behavior_logprobs).detach()
        if tis_cap is not None:
            weight = weight.clamp(max=tis_cap)
        per_token = per_token * weight
    if ref_logprobs is not None and kl_coef:
        per_token = per_token + kl_coef * kl_k3(logprobs, ref_logprobs)
    return masked_mean(per_token, loss_mask)


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
