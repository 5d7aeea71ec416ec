"""Off-policy policy-gradient variants, each written as its equation, and the train-inference importance correction.

Three policies meet at every model token t (logprobs [B, T], as in advantages.py):
- mu, the behaviour policy: the engine's logprob of the sampled token (possibly an older version, engine numerics);
- pi_prox, the proximal policy: the learner's recomputation before the update (no grad). envhub takes one optimizer
  step per learner step, so in the learner pi_prox = sg(pi_theta) in value;
- pi_theta, the current policy (with grad).
A variant's ratio is r = pi_theta / anchor, where anchor = pi_prox on tokens given proximal logprobs and mu elsewhere
(the engine's policy anchors the trust region). Tokens given pi_prox also carry the decoupled behaviour weight
b = sg(min(pi_prox / mu, tis_cap)) (b = 1 elsewhere), so every variant is b * surrogate(r).
Each variant returns the per-token loss [B, T] (0 off the mask) and named diagnostics (token means over the mask);
the token mean over the whole step is the caller's. Equations, papers and defaults: docs/trainer.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from envhub.trainer.learner.advantages import kl_k3, log_ratio, masked_mean
from envhub.trainer.learner.is_correction import CORRECTION_STATS, KL_STATS, behavior_kl, importance_correction


@dataclass(frozen=True)
class PGParams:
    """The variants' constants (defaults: the references' values, docs/trainer.md)."""

    clip_low: float = 0.2  #: PPO / decoupled: ratio clip below 1
    clip_high: float = 0.28  #: PPO / decoupled: ratio clip above 1 (clip-higher)
    dual_clip: float = 0.0  #: PPO / decoupled: a negative-advantage token's loss is capped at c |A| (0 = off, else > 1)
    tis_cap: float = 2.0  #: truncation C of importance weights (TIS, and the behaviour weight b)
    cispo_eps_low: float = 0.1  #: CISPO: weight clipped below at 1 - eps_low
    cispo_eps_high: float = 0.1  #: CISPO: weight clipped above at 1 + eps_high
    topr_positive_weight: float = 1.0  #: TOPR: scale of tokens with a positive advantage
    topr_negative_weight: float = 1.0  #: TOPR: scale of tokens with a zero or negative advantage
    gspo_clip_low: float = 3e-4  #: GSPO: sequence ratio clip below 1
    gspo_clip_high: float = 4e-4  #: GSPO: sequence ratio clip above 1

    @classmethod
    def from_config(cls, cfg: Any) -> PGParams:
        """The constants of an AlgorithmConfig."""
        return cls(**{name: getattr(cfg, name) for name in cls.__dataclass_fields__})


Stats = dict[str, float]
Variant = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, PGParams], tuple[torch.Tensor, Stats]
]


def trust_ratio(logprobs: torch.Tensor, behavior: torch.Tensor, proximal: torch.Tensor | None) -> torch.Tensor:
    """r = pi_theta / anchor, anchor = pi_prox where given, else mu (with grad through pi_theta)."""
    return torch.exp(log_ratio(logprobs, behavior if proximal is None else proximal))


def behavior_weight(behavior: torch.Tensor, proximal: torch.Tensor | None, cap: float) -> torch.Tensor | float:
    """b = sg(min(pi_prox / mu, cap)) where proximal logprobs are given; exactly 1 without them."""
    if proximal is None:
        return 1.0
    return torch.exp(log_ratio(proximal, behavior)).detach().clamp(max=cap)


def per_token(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages [B] broadcast over tokens ([B, 1]); [B, T] unchanged."""
    return advantages.unsqueeze(1) if advantages.ndim == 1 else advantages


def on_mask(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The loss on model tokens, exactly 0 elsewhere (whatever padding held)."""
    return torch.where(mask > 0, loss, torch.zeros_like(loss))


@torch.no_grad()
def fraction(condition: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of model tokens where `condition` holds."""
    return float(masked_mean(condition.to(mask.dtype), mask))


def clip_stats(name: str, ratio: torch.Tensor, low: float, high: float, mask: torch.Tensor) -> Stats:
    """Fractions of model tokens whose ratio lies below `low` / above `high`."""
    ratio = ratio.detach()
    return {
        f"{name}_clip_low_fraction": fraction(ratio < low, mask),
        f"{name}_clip_high_fraction": fraction(ratio > high, mask),
    }


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, p: PGParams) -> torch.Tensor:
    """PPO's objective (maximised): min(r A, clip(r, 1 - clip_low, 1 + clip_high) A); with dual clip c, where A < 0
    it is max(that, c A): a token the policy now prefers far more than its sampler did (r > c) stops pushing."""
    objective = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - p.clip_low, 1.0 + p.clip_high) * adv)
    if p.dual_clip > 0:
        objective = torch.where(adv < 0, torch.maximum(objective, p.dual_clip * adv), objective)
    return objective


def dual_clip_stats(name: str, ratio: torch.Tensor, adv: torch.Tensor, p: PGParams, mask: torch.Tensor) -> Stats:
    """Share of model tokens where the dual clip binds (A < 0 and r > c; 0 when it is off)."""
    binds = (adv < 0) & (ratio.detach() > p.dual_clip) if p.dual_clip > 0 else torch.zeros_like(mask, dtype=torch.bool)
    return {f"{name}_dual_clip_fraction": fraction(binds, mask)}


def ppo(logprobs, behavior, proximal, advantages, mask, p: PGParams) -> tuple[torch.Tensor, Stats]:
    """PPO-clip with clip-higher and optional dual clip: -b * min(r A, clip(r, 1 - clip_low, 1 + clip_high) A),
    where A < 0 at most b c |A|."""
    adv = per_token(advantages)
    ratio = trust_ratio(logprobs, behavior, proximal)
    loss = -clipped_surrogate(ratio, adv, p) * behavior_weight(behavior, proximal, p.tis_cap)
    stats = clip_stats("ppo", ratio, 1.0 - p.clip_low, 1.0 + p.clip_high, mask)
    stats.update(dual_clip_stats("ppo", ratio, adv, p, mask))
    return on_mask(loss, mask), stats


def decoupled(logprobs, behavior, proximal, advantages, mask, p: PGParams) -> tuple[torch.Tensor, Stats]:
    """Decoupled PPO (AReaL): -sg(min(pi_prox / mu, C)) * min(r A, clip(r) A), r = pi_theta / pi_prox; dual clip as
    in `ppo`."""
    if proximal is None:
        raise ValueError("decoupled PPO needs proximal logprobs (the learner's recomputation before the update)")
    adv = per_token(advantages)
    ratio = trust_ratio(logprobs, behavior, proximal)
    behavior = torch.exp(log_ratio(proximal, behavior)).detach()
    loss = -behavior.clamp(max=p.tis_cap) * clipped_surrogate(ratio, adv, p)
    stats = clip_stats("decoupled", ratio, 1.0 - p.clip_low, 1.0 + p.clip_high, mask)
    stats.update(dual_clip_stats("decoupled", ratio, adv, p, mask))
    stats["decoupled_weight_mean"] = float(masked_mean(behavior.clamp(max=p.tis_cap), mask))
    stats["decoupled_truncated_fraction"] = fraction(behavior > p.tis_cap, mask)
    return on_mask(loss, mask), stats


def vanilla(logprobs, behavior, proximal, advantages, mask, p: PGParams) -> tuple[torch.Tensor, Stats]:
    """REINFORCE (Williams 1992; ROLL's "vanilla"): -b * A * log pi_theta. No ratio: a sample one version old weighs
    what a fresh one does, so a large step cannot clip or reweight a stale batch away (biased by the lag, low
    variance)."""
    loss = -behavior_weight(behavior, proximal, p.tis_cap) * per_token(advantages) * logprobs
    return on_mask(loss, mask), {}


def tis(logprobs, behavior, proximal, advantages, mask, p: PGParams) -> tuple[torch.Tensor, Stats]:
    """Truncated importance sampling (Yao et al.): -sg(min(r, C)) * b * A * log pi_theta."""
    adv = per_token(advantages)
    ratio = trust_ratio(logprobs, behavior, proximal).detach()
    weight = ratio.clamp(max=p.tis_cap) * behavior_weight(behavior, proximal, p.tis_cap)
    loss = -weight * adv * logprobs
    stats = {
        "tis_weight_mean": float(masked_mean(weight, mask)),
        "tis_truncated_fraction": fraction(ratio > p.tis_cap, mask),
    }
    return on_mask(loss, mask), stats


def cispo(logprobs, behavior, proximal, advantages, mask, p: PGParams) -> tuple[torch.Tensor, Stats]:
    """CISPO (MiniMax-M1): -sg(clip(r, 1 - eps_low, 1 + eps_high)) * b * A * log pi_theta; no token loses its
    gradient."""
    adv = per_token(advantages)
    ratio = trust_ratio(logprobs, behavior, proximal).detach()
    low, high = 1.0 - p.cispo_eps_low, 1.0 + p.cispo_eps_high
    weight = ratio.clamp(low, high) * behavior_weight(behavior, proximal, p.tis_cap)
    loss = -weight * adv * logprobs
    return on_mask(loss, mask), clip_stats("cispo", ratio, low, high, mask)


def topr(logprobs, behavior, proximal, advantages, mask, p: PGParams) -> tuple[torch.Tensor, Stats]:
    """TOPR (Le Roux et al.): A > 0 -> -A log pi_theta (no ratio); A <= 0 -> -sg(clip(r, 0, 1)) A log pi_theta;
    times the set's scale and b."""
    adv = per_token(advantages)
    ratio = trust_ratio(logprobs, behavior, proximal).detach()
    positive = (adv > 0).expand_as(ratio)
    tapered = p.topr_negative_weight * ratio.clamp(0.0, 1.0)
    weight = torch.where(positive, torch.full_like(ratio, p.topr_positive_weight), tapered)
    loss = -weight * behavior_weight(behavior, proximal, p.tis_cap) * adv * logprobs
    stats = {
        "topr_positive_fraction": fraction(positive, mask),
        "topr_negative_truncated_fraction": fraction(~positive & (ratio > 1.0), mask),
    }
    return on_mask(loss, mask), stats


def sequence_ratio(logprobs: torch.Tensor, anchor: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's s_i = exp(mean over sequence i's model tokens of log(pi_theta / anchor)), [B, 1], with grad."""
    per_token_log = torch.where(mask > 0, log_ratio(logprobs, anchor), torch.zeros_like(logprobs))
    return torch.exp(per_token_log.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0))


def gspo(logprobs, behavior, proximal, advantages, mask, p: PGParams) -> tuple[torch.Tensor, Stats]:
    """GSPO (Zheng et al., 2025), its token form (GSPO-token, eq. 13): s_it = sg(s_i) * pi_theta(y_t) /
    sg(pi_theta(y_t)), equal to the length-normalised sequence ratio s_i in value, so the ratio and its clip
    [1 - gspo_clip_low, 1 + gspo_clip_high] act per sequence while each token keeps its own advantage (turn-level
    credit); -b * min(s_it A_t, clip(s_it) A_t). With one advantage per sequence it is GSPO's sequence objective, its
    gradient weighted per token (the step's token mean) rather than per sequence."""
    adv = per_token(advantages)
    anchor = behavior if proximal is None else torch.where(mask > 0, proximal, behavior)
    seq = sequence_ratio(logprobs, anchor, mask)
    token = seq.detach() * torch.exp(logprobs - logprobs.detach())
    token = torch.where(mask > 0, token, torch.ones_like(token))
    objective = torch.minimum(token * adv, torch.clamp(token, 1.0 - p.gspo_clip_low, 1.0 + p.gspo_clip_high) * adv)
    loss = -objective * behavior_weight(behavior, proximal, p.tis_cap)
    rows = (mask.sum(dim=1) > 0).float()
    seq_value = seq.detach().squeeze(1)
    stats = {
        "gspo_clip_low_fraction": fraction(token < 1.0 - p.gspo_clip_low, mask),
        "gspo_clip_high_fraction": fraction(token > 1.0 + p.gspo_clip_high, mask),
        "gspo_ratio_mean": float((seq_value * rows).sum() / rows.sum().clamp(min=1.0)),
    }
    return on_mask(loss, mask), stats


PG_VARIANTS: dict[str, Variant] = {
    "ppo": ppo,
    "vanilla": vanilla,
    "tis": tis,
    "cispo": cispo,
    "topr": topr,
    "decoupled": decoupled,
    "gspo": gspo,
}
#: the diagnostics each variant returns, in a fixed order (the learner sums them over micro-batches and processes)
VARIANT_STATS: dict[str, tuple[str, ...]] = {
    "ppo": ("ppo_clip_low_fraction", "ppo_clip_high_fraction", "ppo_dual_clip_fraction"),
    "vanilla": (),
    "tis": ("tis_weight_mean", "tis_truncated_fraction"),
    "cispo": ("cispo_clip_low_fraction", "cispo_clip_high_fraction"),
    "topr": ("topr_positive_fraction", "topr_negative_truncated_fraction"),
    "decoupled": (
        "decoupled_clip_low_fraction",
        "decoupled_clip_high_fraction",
        "decoupled_dual_clip_fraction",
        "decoupled_weight_mean",
        "decoupled_truncated_fraction",
    ),
    "gspo": ("gspo_clip_low_fraction", "gspo_clip_high_fraction", "gspo_ratio_mean"),
}


def pg_stat_names(cfg: Any) -> tuple[str, ...]:
    """Names of the diagnostics `pg_token_loss` returns under an AlgorithmConfig, in order."""
    names = VARIANT_STATS[cfg.pg_variant] + KL_STATS
    return names + CORRECTION_STATS if cfg.is_correction.level != "none" else names


def pg_token_loss(
    logprobs: torch.Tensor,
    behavior: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: Any,
    *,
    stale: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """Per-token loss [B, T] of `cfg.pg_variant` with `cfg.is_correction` and the k3 KL term, and its diagnostics.

    pi_prox is `logprobs.detach()`: the learner recomputes before its single update. It anchors the variant on
    stale tokens (`stale`, algorithm.stale: correct), on every token for "decoupled", and, when the correction
    weighs the loss, on every token with mu replaced by pi_prox (three policies: the variant's ratio is
    pi_theta / pi_prox and the mismatch pi_prox / mu lives in the correction weight alone, never twice).
    """
    recomputed = logprobs.detach()
    spec = cfg.is_correction
    weighs = spec.level != "none" and spec.apply_weight
    variant_behavior, proximal = behavior, None
    if weighs:
        variant_behavior, proximal = recomputed, recomputed
    elif cfg.pg_variant == "decoupled":
        proximal = recomputed
    elif stale is not None and bool(stale.any()):
        proximal = torch.where(stale, recomputed, behavior)
    loss, stats = PG_VARIANTS[cfg.pg_variant](
        logprobs, variant_behavior, proximal, advantages, mask, PGParams.from_config(cfg)
    )
    stats.update(behavior_kl(recomputed, behavior, mask))
    if spec.level != "none":
        weight, keep, correction = importance_correction(
            recomputed, behavior, mask, spec.level, spec.cap, spec.mask_low, spec.mask_high
        )
        loss = loss * (weight if weighs else 1.0) * keep
        stats.update(correction)
    if ref_logprobs is not None and cfg.kl_coef:
        loss = loss + cfg.kl_coef * kl_k3(logprobs, ref_logprobs)
    return loss, stats
