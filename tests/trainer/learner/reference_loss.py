"""The reference policy loss, as the learner computed it before pg_variants: the default variant must reproduce it."""

from __future__ import annotations

import torch

from envhub.trainer.learner.advantages import kl_k3, masked_mean


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

    The reference the learner's default loss (pg_variants.pg_token_loss, "ppo") must equal bit for bit
    (test_pg_variants.py); it was the learner's own loss before the variants.

    ratio = exp(lp - anchor), anchor = behavior logprobs (or `proximal_logprobs` when given);
    per-token loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A).
    With `proximal_logprobs` (decoupled PPO for stale samples), each token's loss is weighted by
    exp(proximal - behavior), truncated at `tis_cap`. With `ref_logprobs`, kl_coef * k3 is added.
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
