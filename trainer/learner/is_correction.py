"""Train-inference importance correction: a detached weight from rho_t = pi_prox / mu (learner's recomputation over
the engine's behaviour logprob), per token, per sequence or as a geometric mean, truncated and optionally masked.

Levels (ROLL's and verl's names), over the masked tokens of sequence i:
- token: w_t = rho_t;
- sequence: w_i = prod_t rho_t = exp(sum_t log rho_t), broadcast over the sequence;
- geometric: w_i = exp(mean_t log rho_t) (length-invariant; GSPO's ratio, verl's Geo-RS).
Truncation w -> min(w, cap) (Yao et al.'s TIS); masking keeps a token (token level) or a whole sequence only while
mask_low <= w <= mask_high before truncation (masked IS / rejection: ROLL filters, verl rollout_rs).
Exponents are clamped to +-LOG_RATIO_BOUND, so a product over a long sequence never overflows to inf.
"""

from __future__ import annotations

import torch

from envhub.trainer.learner.advantages import LOG_RATIO_BOUND, log_ratio, masked_mean

LEVELS = ("token", "sequence", "geometric")
#: statistics of `importance_correction`: token means over model tokens
CORRECTION_STATS = ("is_weight_mean", "is_truncated_fraction", "is_masked_fraction")
#: statistics of `behavior_kl`
KL_STATS = ("is_kl_k1", "is_kl_k3")


@torch.no_grad()
def importance_correction(
    proximal: torch.Tensor,
    behavior: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    cap: float = 2.0,
    mask_low: float = 0.0,
    mask_high: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(weight [B, T] truncated at `cap` (0 = no truncation), keep [B, T] bool, statistics); all detached.

    keep is False where the weight before truncation is below `mask_low` or above `mask_high` (0 = that side off).
    """
    if level not in LEVELS:
        raise ValueError(f"unknown importance-correction level {level!r}; use one of {', '.join(LEVELS)}")
    on = mask > 0
    log_rho = torch.where(on, log_ratio(proximal, behavior), torch.zeros_like(proximal))
    if level == "token":
        log_w = log_rho
    elif level == "sequence":
        log_w = log_rho.sum(dim=1, keepdim=True)
    else:
        log_w = log_rho.sum(dim=1, keepdim=True) / on.sum(dim=1, keepdim=True).clamp(min=1)
    raw = torch.exp(log_w.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)).expand_as(log_rho)
    keep = torch.ones_like(on)
    if mask_low > 0:
        keep &= raw >= mask_low
    if mask_high > 0:
        keep &= raw <= mask_high
    weight = raw.clamp(max=cap) if cap > 0 else raw
    truncated = raw > cap if cap > 0 else torch.zeros_like(on)
    stats = {
        "is_weight_mean": float(masked_mean(weight, mask)),
        "is_truncated_fraction": float(masked_mean(truncated.to(mask.dtype), mask)),
        "is_masked_fraction": float(masked_mean((~keep).to(mask.dtype), mask)),
    }
    return weight, keep, stats


@torch.no_grad()
def behavior_kl(proximal: torch.Tensor, behavior: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """KL(mu || pi_prox) over the sampled tokens: k1 = mean(log mu - log pi_prox), k3 = mean(rho - log rho - 1)."""
    log_rho = log_ratio(proximal, behavior)
    return {
        "is_kl_k1": float(masked_mean(-log_rho, mask)),
        "is_kl_k3": float(masked_mean(torch.exp(log_rho) - log_rho - 1.0, mask)),
    }
