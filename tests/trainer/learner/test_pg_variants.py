"""Each policy-gradient variant and the importance correction against references written here as plain loops.

The references never call envhub's loss code: they take nested lists, walk tokens one by one with `math`, and give the
per-token loss and its derivative by the token's own logprob (the analytic gradient, checked by central differences
where the loss has no stop-gradient). Data: random groups of rewards, advantages normalised per group in the
reference, random prompt / padding masks, behaviour logprobs that are off by up to ~e^1.5 so every clip and cap binds.
"""

from __future__ import annotations

import dataclasses
import math
import random
import typing
from pathlib import Path

import pytest
import torch
import yaml

from envhub.errors import ConfigError
from envhub.trainer.config import AlgorithmConfig, ISCorrectionConfig, config_from_dict
from envhub.trainer.learner.advantages import masked_mean
from envhub.trainer.learner.is_correction import LEVELS, behavior_kl, importance_correction
from envhub.trainer.learner.pg_variants import PG_VARIANTS, PGParams, pg_stat_names, pg_token_loss
from envhub.trainer.learner.step import Learner
from tests.trainer.learner.conftest import algo, make_groups
from tests.trainer.learner.reference_loss import policy_loss

PARAMS = PGParams(tis_cap=1.6, cispo_eps_low=0.15, cispo_eps_high=0.25, topr_positive_weight=0.9)
DUAL = dataclasses.replace(PARAMS, dual_clip=2.5)  # PPO / decoupled with the dual clip on

# --- data ----------------------------------------------------------------------------------------------------------


def random_batch(seed: int, groups: int = 3, group_size: int = 4, width: int = 9, spread: float = 0.6) -> dict:
    """Nested lists: lp, mu, prox, mask (prompt zeros, model ones, padding zeros) and per-group advantages."""
    rng = random.Random(seed)
    rows = groups * group_size
    rewards = [float(rng.randint(0, 3)) for _ in range(rows)]
    advantages = []
    for g in range(groups):
        group = rewards[g * group_size : (g + 1) * group_size]
        mean = sum(group) / group_size
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / group_size)
        advantages += [(r - mean) / (std + 1e-6) if std > 1e-6 else 0.0 for r in group]
    mask, lp, mu, prox = [], [], [], []
    for _ in range(rows):
        prompt, length = rng.randint(1, 3), rng.randint(4, width)
        mask.append([float(prompt <= t < length) for t in range(width)])
        lp.append([math.log(rng.uniform(0.02, 0.98)) for _ in range(width)])
        mu.append([x + rng.uniform(-spread, spread) * 2.5 for x in lp[-1]])
        prox.append([x + rng.uniform(-spread, spread) for x in lp[-1]])
    return {"lp": lp, "mu": mu, "prox": prox, "mask": mask, "adv": advantages}


def tensors(batch: dict) -> tuple[torch.Tensor, ...]:
    lp = torch.tensor(batch["lp"], dtype=torch.float64, requires_grad=True)
    mu, prox, mask = (torch.tensor(batch[k], dtype=torch.float64) for k in ("mu", "prox", "mask"))
    return lp, mu, prox, mask, torch.tensor(batch["adv"], dtype=torch.float64)


# --- references: one token at a time ---------------------------------------------------------------------------------


def clip(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


def reference_token(variant: str, lp: float, mu: float, prox: float | None, a: float, p: PGParams) -> tuple[float, ...]:
    """(loss, d loss / d lp) of one token, straight from the variant's equation."""
    anchor = mu if prox is None else prox
    r = math.exp(lp - anchor)
    b = 1.0 if prox is None else min(math.exp(prox - mu), p.tis_cap)
    if variant in ("ppo", "decoupled"):
        unclipped, clipped = r * a, clip(r, 1 - p.clip_low, 1 + p.clip_high) * a
        inside = 1 - p.clip_low <= r <= 1 + p.clip_high
        objective, slope = min(unclipped, clipped), r * a if inside or unclipped < clipped else 0.0
        if p.dual_clip and a < 0 and objective < p.dual_clip * a:  # Ye et al.'s dual clip: a floor at c A
            objective, slope = p.dual_clip * a, 0.0
        return -b * objective, -b * slope
    if variant == "vanilla":
        w = b
    elif variant == "tis":
        w = min(r, p.tis_cap) * b
    elif variant == "cispo":
        w = clip(r, 1 - p.cispo_eps_low, 1 + p.cispo_eps_high) * b
    elif variant == "topr":
        w = (p.topr_positive_weight if a > 0 else p.topr_negative_weight * clip(r, 0.0, 1.0)) * b
    return -w * a * lp, -w * a  # the weight is detached: log pi carries the whole gradient


def reference_gspo(batch: dict, i: int, t: int, p: PGParams, with_prox: bool) -> tuple[float, float]:
    """GSPO-token (Zheng et al., eq. 13) at token t of row i: s_i = exp(mean over the row's model tokens of
    (lp - anchor)); s_it = sg(s_i) pi(y_t) / sg(pi(y_t)), so d s_it / d lp_t = s_i; loss -b min(s A, clip(s) A)."""
    anchor = batch["prox"][i] if with_prox else batch["mu"][i]
    logs = [batch["lp"][i][k] - anchor[k] for k, m in enumerate(batch["mask"][i]) if m]
    s, a = math.exp(sum(logs) / len(logs)), batch["adv"][i]
    b = min(math.exp(batch["prox"][i][t] - batch["mu"][i][t]), p.tis_cap) if with_prox else 1.0
    unclipped, clipped = s * a, clip(s, 1 - p.gspo_clip_low, 1 + p.gspo_clip_high) * a
    inside = 1 - p.gspo_clip_low <= s <= 1 + p.gspo_clip_high
    return -b * min(unclipped, clipped), -b * (s * a if inside or unclipped < clipped else 0.0)


def reference(variant: str, batch: dict, p: PGParams, with_prox: bool) -> tuple[list, list]:
    """Per-token losses and d(token-mean loss)/d lp over a batch (0 off the mask)."""
    count = sum(sum(row) for row in batch["mask"]) or 1.0
    losses, grads = [], []
    for i, row in enumerate(batch["mask"]):
        losses.append([]), grads.append([])
        for t, m in enumerate(row):
            prox = batch["prox"][i][t] if with_prox else None
            if variant == "gspo":
                loss, grad = reference_gspo(batch, i, t, p, with_prox) if m else (0.0, 0.0)
            else:
                loss, grad = reference_token(variant, batch["lp"][i][t], batch["mu"][i][t], prox, batch["adv"][i], p)
            losses[-1].append(loss if m else 0.0)
            grads[-1].append(grad / count if m else 0.0)
    return losses, grads


# --- each variant against its equation --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "variant, with_prox, params",
    [
        (v, with_prox, PARAMS)
        for v in sorted(PG_VARIANTS)
        for with_prox in (False, True)
        if with_prox or v != "decoupled"
    ]
    + [("ppo", False, DUAL), ("ppo", True, DUAL), ("decoupled", True, DUAL)],
)  # decoupled refuses to run without the proximal policy (below)
def test_variant_loss_and_gradient_match_the_reference(variant, with_prox, params, seed):
    batch = random_batch(seed)
    lp, mu, prox, mask, adv = tensors(batch)
    loss, stats = PG_VARIANTS[variant](lp, mu, prox if with_prox else None, adv, mask, params)
    (grad,) = torch.autograd.grad(masked_mean(loss, mask), lp)
    want_loss, want_grad = reference(variant, batch, params, with_prox)
    assert torch.allclose(loss, torch.tensor(want_loss, dtype=torch.float64), atol=1e-12, rtol=1e-10)
    assert torch.allclose(grad, torch.tensor(want_grad, dtype=torch.float64), atol=1e-12, rtol=1e-10)
    assert tuple(stats) == pg_stat_names(algo(pg_variant=variant))[: len(stats)]
    if params.dual_clip:  # the share of model tokens whose floor binds, counted token by token
        anchor = batch["prox"] if with_prox else batch["mu"]
        binds = [
            m and batch["adv"][i] < 0 and math.exp(batch["lp"][i][t] - anchor[i][t]) > params.dual_clip
            for i, row in enumerate(batch["mask"])
            for t, m in enumerate(row)
        ]
        want = sum(binds) / sum(sum(row) for row in batch["mask"])
        assert stats[f"{variant}_dual_clip_fraction"] == pytest.approx(want, abs=1e-12)
    assert all(0.0 <= v <= (PARAMS.tis_cap**2 if "mean" in k else 1.0) for k, v in stats.items())


def test_the_data_exercises_every_branch():
    """A reference that never clips would pass against a loss that never clips: show that they all bind."""
    ratios, signs = [], []
    for seed in (0, 1, 2):
        batch = random_batch(seed)
        for i, row in enumerate(batch["mask"]):
            for t, m in enumerate(row):
                if m:
                    ratios.append(math.exp(batch["lp"][i][t] - batch["mu"][i][t]))
                    signs.append(batch["adv"][i])
    assert any(r < 1 - PARAMS.clip_low and a < 0 for r, a in zip(ratios, signs))  # PPO clip binds below
    assert any(r > DUAL.dual_clip and a < 0 for r, a in zip(ratios, signs))  # the dual clip binds
    assert any(r > 1 + PARAMS.clip_high and a > 0 for r, a in zip(ratios, signs))  # ... and above
    assert any(r > PARAMS.tis_cap for r in ratios) and any(r > 1 and a < 0 for r, a in zip(ratios, signs))  # TIS, TOPR
    assert any(a == 0 for a in signs) and any(a > 0 for a in signs)  # zero-variance groups and both TOPR sets


@pytest.mark.parametrize("params", [PARAMS, DUAL])
@pytest.mark.parametrize("variant", ["ppo", "decoupled"])
def test_clipped_losses_match_central_differences(variant, params):
    """No stop-gradient in PPO's ratio: the autograd gradient is the numeric derivative of the reference loss."""
    batch = random_batch(5)
    lp, mu, prox, mask, adv = tensors(batch)
    loss, _ = PG_VARIANTS[variant](lp, mu, prox, adv, mask, params)
    (grad,) = torch.autograd.grad(loss.sum(), lp)
    h, checked = 1e-6, 0
    for i, row in enumerate(batch["mask"]):
        for t, m in enumerate(row):
            if not m:
                continue
            r = math.exp(batch["lp"][i][t] - batch["prox"][i][t])
            kinks = (1 - params.clip_low, 1 + params.clip_high, params.dual_clip)
            if min(abs(r - k) for k in kinks) < 1e-4:
                continue  # a kink of the clip: no derivative there
            f = [reference_token(variant, batch["lp"][i][t] + s, batch["mu"][i][t], batch["prox"][i][t],
                                 batch["adv"][i], params)[0] for s in (h, -h)]  # fmt: skip
            assert grad[i, t].item() == pytest.approx((f[0] - f[1]) / (2 * h), abs=1e-6)
            checked += 1
    assert checked > 20


def test_decoupled_refuses_to_run_without_the_proximal_policy():
    lp, mu, _, mask, adv = tensors(random_batch(0))
    with pytest.raises(ValueError, match="proximal"):
        PG_VARIANTS["decoupled"](lp, mu, None, adv, mask, PARAMS)


# --- the default reproduces today's loss -----------------------------------------------------------------------------


@pytest.mark.parametrize("stale_share", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("kl_coef", [0.0, 0.07])
def test_default_ppo_reproduces_the_current_policy_loss_exactly(stale_share, kl_coef):
    """The learner's call (pg_token_loss, default config) against reference_loss.policy_loss, the loss as step.py
    computed it before variants existed: same loss and gradient, bit for bit."""
    batch = random_batch(11)
    lp, mu, _, mask, adv = tensors(batch)
    generator = torch.Generator().manual_seed(3)
    stale = (torch.rand(mask.shape, generator=generator) < stale_share) & (mask > 0)
    ref = lp.detach() + 0.3 * torch.randn(mask.shape, generator=generator, dtype=torch.float64)
    cfg = AlgorithmConfig(kl_coef=kl_coef)
    per_token, _ = pg_token_loss(lp, mu, adv, mask, cfg, stale=stale, ref_logprobs=ref)
    new = masked_mean(per_token, mask)
    proximal = torch.where(stale, lp.detach(), mu) if bool(stale.any()) else None
    old = policy_loss(
        lp, mu, adv, mask, cfg.clip_low, cfg.clip_high, proximal_logprobs=proximal,
        tis_cap=cfg.tis_cap if proximal is not None else None, ref_logprobs=ref, kl_coef=cfg.kl_coef,
    )  # fmt: skip
    assert torch.equal(new, old) and torch.equal(new, (per_token * mask).sum() / mask.sum())  # masked_mean as it was
    assert torch.equal(torch.autograd.grad(new, lp)[0], torch.autograd.grad(old, lp)[0])


def test_in_the_learner_decoupled_and_stale_ppo_give_the_tis_gradient():
    """One optimizer step per learner step makes pi_prox = pi_theta: decoupled PPO, PPO on all-stale tokens and
    TIS all reduce to -min(pi / mu, C) A grad log pi."""
    lp, mu, _, mask, adv = tensors(random_batch(4))
    all_stale = mask > 0
    grads = {}
    for name, cfg, stale in [
        ("decoupled", algo(pg_variant="decoupled"), None),
        ("ppo, all stale", algo(), all_stale),
        ("tis", algo(pg_variant="tis"), None),
    ]:
        loss, _ = pg_token_loss(lp, mu, adv, mask, cfg, stale=stale)
        grads[name] = torch.autograd.grad(masked_mean(loss, mask), lp)[0]
    expected = -torch.exp(lp.detach() - mu).clamp(max=2.0) * adv.unsqueeze(1) * mask / mask.sum()
    for name, grad in grads.items():
        assert torch.allclose(grad, expected, rtol=1e-12, atol=0), name


# --- importance correction ------------------------------------------------------------------------------------------


def reference_correction(batch: dict, level: str, cap: float, low: float, high: float) -> tuple[list, list]:
    """Weights (truncated) and keep flags per token, from log rho = prox - mu over each row's model tokens."""
    weights, keeps = [], []
    for i, row in enumerate(batch["mask"]):
        logs = [batch["prox"][i][t] - batch["mu"][i][t] for t, m in enumerate(row) if m]
        if level == "sequence":
            seq = math.exp(sum(logs))
        elif level == "geometric":
            seq = math.exp(sum(logs) / len(logs)) if logs else 1.0
        raw = [math.exp(batch["prox"][i][t] - batch["mu"][i][t]) if level == "token" else seq for t in range(len(row))]
        weights.append([min(w, cap) if cap else w for w in raw])
        keeps.append([(not low or w >= low) and (not high or w <= high) for w in raw])
    return weights, keeps


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("cap, low, high", [(2.0, 0.0, 0.0), (1.2, 0.5, 2.0), (0.0, 0.0, 1.5)])
def test_importance_correction_matches_the_reference(level, cap, low, high):
    batch = random_batch(7, spread=0.25)
    _, mu, prox, mask, _ = tensors(batch)
    weight, keep, stats = importance_correction(prox, mu, mask, level, cap, low, high)
    want_w, want_keep = reference_correction(batch, level, cap, low, high)
    on = [(i, t) for i, row in enumerate(batch["mask"]) for t, m in enumerate(row) if m]
    for i, t in on:
        assert weight[i, t].item() == pytest.approx(want_w[i][t], rel=1e-10) and keep[i, t].item() == want_keep[i][t]
    raw = reference_correction(batch, level, 0.0, 0.0, 0.0)[0]
    assert stats["is_weight_mean"] == pytest.approx(sum(want_w[i][t] for i, t in on) / len(on), rel=1e-10)
    assert stats["is_truncated_fraction"] == pytest.approx(sum(bool(cap) and raw[i][t] > cap for i, t in on) / len(on))
    assert stats["is_masked_fraction"] == pytest.approx(sum(not want_keep[i][t] for i, t in on) / len(on))
    assert not weight.requires_grad and (cap == 0 or weight.max() <= cap)


def test_the_correction_data_exercises_truncation_and_both_masks():
    batch = random_batch(7, spread=0.25)
    _, mu, prox, mask, _ = tensors(batch)
    for level in LEVELS:
        _, keep, stats = importance_correction(prox, mu, mask, level, 1.2, 0.5, 2.0)
        assert 0 < stats["is_truncated_fraction"] < 1, level
    _, _, token = importance_correction(prox, mu, mask, "token", 1.2, 0.9, 1.1)
    assert 0 < token["is_masked_fraction"] < 1


def test_behavior_kl_k1_and_k3_match_the_reference():
    batch = random_batch(8)
    _, mu, prox, mask, _ = tensors(batch)
    on = [(i, t) for i, row in enumerate(batch["mask"]) for t, m in enumerate(row) if m]
    log_rho = [batch["prox"][i][t] - batch["mu"][i][t] for i, t in on]
    stats = behavior_kl(prox, mu, mask)
    assert stats["is_kl_k1"] == pytest.approx(sum(-x for x in log_rho) / len(on), rel=1e-10)
    assert stats["is_kl_k3"] == pytest.approx(sum(math.exp(x) - x - 1 for x in log_rho) / len(on), rel=1e-10)


@pytest.mark.parametrize("variant", sorted(PG_VARIANTS))
@pytest.mark.parametrize("level", LEVELS)
def test_correction_weight_replaces_the_behavior_ratio_in_every_variant(variant, level):
    """With the weight on, the variant is anchored at pi_prox = sg(pi_theta) (ratio 1) and pi_prox / mu enters once:
    the gradient is -w keep A grad log pi (TOPR's positive tokens take their scale)."""
    batch = random_batch(9, spread=0.25)
    lp, mu, _, mask, adv = tensors(batch)
    batch["prox"] = batch["lp"]  # the learner's recomputation
    spec = ISCorrectionConfig(level=level, cap=1.3, mask_low=0.6, mask_high=1.8)
    loss, stats = pg_token_loss(lp, mu, adv, mask, algo(pg_variant=variant, is_correction=spec))
    (grad,) = torch.autograd.grad(masked_mean(loss, mask), lp)
    weights, keeps = reference_correction(batch, level, spec.cap, spec.mask_low, spec.mask_high)
    count = sum(map(sum, batch["mask"]))
    for i, row in enumerate(batch["mask"]):
        a = batch["adv"][i]
        for t, m in enumerate(row):
            want = -weights[i][t] * keeps[i][t] * a / count if m else 0.0
            assert grad[i, t].item() == pytest.approx(want, abs=1e-12)
    assert tuple(stats) == pg_stat_names(algo(pg_variant=variant, is_correction=spec))


def test_mask_only_correction_keeps_the_variant_anchored_at_the_engine():
    batch = random_batch(9, spread=0.25)
    lp, mu, _, mask, adv = tensors(batch)
    spec = ISCorrectionConfig(level="geometric", mask_low=0.9, mask_high=1.1, apply_weight=False)
    loss, stats = pg_token_loss(lp, mu, adv, mask, algo(pg_variant="cispo", is_correction=spec))
    plain, _ = pg_token_loss(lp, mu, adv, mask, algo(pg_variant="cispo"))
    _, keep, _ = importance_correction(lp.detach(), mu, mask, "geometric", 2.0, 0.9, 1.1)
    assert torch.equal(loss, plain * keep) and 0 < stats["is_masked_fraction"] < 1


# --- edge cases ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(PG_VARIANTS))
def test_empty_mask_gives_zero_loss_zero_gradient_and_finite_stats(variant):
    lp, mu, prox, mask, adv = tensors(random_batch(0))
    empty = torch.zeros_like(mask)
    cfg = algo(pg_variant=variant, is_correction=ISCorrectionConfig(level="geometric", mask_high=1.5))
    loss, stats = pg_token_loss(lp, mu, adv, empty, cfg, stale=empty > 0)
    total = masked_mean(loss, empty)
    assert total.item() == 0.0 and torch.equal(loss, torch.zeros_like(loss))
    (grad,) = torch.autograd.grad(total, lp, allow_unused=True)
    assert grad is None or not grad.any()
    assert all(v == 0.0 for v in stats.values())


@pytest.mark.parametrize("variant", sorted(PG_VARIANTS))
def test_zero_advantages_give_zero_loss_and_gradient(variant):
    lp, mu, prox, mask, adv = tensors(random_batch(1))
    loss, _ = PG_VARIANTS[variant](lp, mu, prox, torch.zeros_like(adv), mask, PARAMS)
    (grad,) = torch.autograd.grad(masked_mean(loss, mask), lp)
    assert not loss.any() and not grad.any()


@pytest.mark.parametrize("variant", sorted(PG_VARIANTS))
@pytest.mark.parametrize("level", ["none", *LEVELS])
def test_extreme_ratios_stay_finite(variant, level):
    """Engines can report -inf or wildly off logprobs: the loss and gradient stay finite (log-ratios clamped at
    +-20), and a product of ratios over a long sequence does not overflow."""
    width = 400
    lp = torch.full((4, width), -2.0, dtype=torch.float64, requires_grad=True)
    mu = torch.tensor([[-1e4], [1e4], [-math.inf], [0.0]], dtype=torch.float64).expand(4, width).clone()
    mu[3, ::2], mu[3, 1::2] = -math.inf, math.inf  # per-token clamps first: a sum of +-inf would be nan
    mask, adv = torch.ones(4, width, dtype=torch.float64), torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    spec = ISCorrectionConfig(level=level, cap=0.0) if level != "none" else ISCorrectionConfig()
    loss, stats = pg_token_loss(lp, mu, adv, mask, algo(pg_variant=variant, is_correction=spec), stale=mask > 0)
    (grad,) = torch.autograd.grad(masked_mean(loss, mask), lp)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in stats.values())


def test_nan_behavior_logprobs_still_reach_the_learners_guard():
    """A NaN from an engine is not hidden as a number: it reaches the gradient, which makes the learner skip the
    step (test_step.py). (It sits on a token with A < 0: TOPR's positive tokens never read mu.) REINFORCE never reads
    mu on a fresh token, so the NaN cannot reach its weights; it shows in the behaviour KL it logs."""
    lp, mu, _, mask, adv = tensors(random_batch(0))
    i, t = map(int, (mask * (adv < 0).unsqueeze(1)).nonzero()[0])
    mu[i, t] = math.nan
    for variant in PG_VARIANTS:
        loss, stats = pg_token_loss(lp, mu, adv, mask, algo(pg_variant=variant))
        (grad,) = torch.autograd.grad(masked_mean(loss, mask), lp)
        assert math.isnan(stats["is_kl_k1"]), variant
        if variant == "vanilla":
            assert torch.isfinite(grad).all()
        else:
            assert not torch.isfinite(grad).all(), variant


def test_padding_holding_garbage_is_ignored():
    lp, mu, _, mask, adv = tensors(random_batch(2))
    poisoned = torch.where(mask > 0, mu, torch.full_like(mu, math.nan))
    for variant in PG_VARIANTS:
        clean, clean_stats = pg_token_loss(lp, mu, adv, mask, algo(pg_variant=variant))
        dirty, dirty_stats = pg_token_loss(lp, poisoned, adv, mask, algo(pg_variant=variant))
        assert torch.equal(clean, dirty) and clean_stats == dirty_stats, variant


# --- config and learner ----------------------------------------------------------------------------------------------


def test_config_choices_are_the_registry_and_the_levels():
    hints = typing.get_type_hints(AlgorithmConfig)
    assert set(typing.get_args(hints["pg_variant"])) == set(PG_VARIANTS)
    assert set(typing.get_args(typing.get_type_hints(ISCorrectionConfig)["level"])) == {"none", *LEVELS}
    assert PGParams.from_config(AlgorithmConfig()) == PGParams(tis_cap=2.0, cispo_eps_low=0.1, cispo_eps_high=0.1)


def test_config_reads_the_variant_and_the_correction():
    cfg = config_from_dict(
        {
            "tasks": [{"env": "Math-v0"}],
            "algorithm": {"pg_variant": "topr", "is_correction": {"level": "sequence", "cap": 2, "mask_high": 2.0}},
        }
    )
    assert cfg.algorithm.pg_variant == "topr" and cfg.algorithm.is_correction.level == "sequence"
    assert cfg.algorithm.is_correction.cap == 2.0 and cfg.algorithm.is_correction.apply_weight


@pytest.mark.parametrize(
    "algorithm, message",
    [
        (
            {"pg_variant": "cipso"},
            "pg_variant must be one of ppo, vanilla, tis, cispo, topr, decoupled, gspo, got 'cipso'.*'cispo'",
        ),
        ({"is_correction": {"level": "seq"}}, "level must be one of none, token, sequence, geometric"),
        ({"is_correction": {"levl": "token"}}, "unknown config key 'algorithm.is_correction.levl'.*'level'"),
        ({"tis_cap": 0}, "tis_cap must be positive"),
        ({"dual_clip": 0.5}, r"dual_clip must be 0 \(off\) or above 1, got 0.5.*3.0"),
        ({"cispo_eps_high": -0.1}, "cispo_eps_high must be >= 0"),
        ({"topr_negative_weight": -1}, "topr_negative_weight must be >= 0"),
        ({"is_correction": {"cap": -2}}, "is_correction.cap must be >= 0"),
        ({"is_correction": {"mask_low": 2.0, "mask_high": 0.5}}, "empty"),
    ],
)
def test_bad_variant_settings_are_clear_errors(algorithm, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": algorithm})


@pytest.mark.parametrize(
    "overrides",
    [{"pg_variant": v} for v in sorted(PG_VARIANTS)]
    + [{"pg_variant": "cispo", "is_correction": ISCorrectionConfig(level="geometric", mask_low=0.5, mask_high=2.0)}],
)
def test_learner_steps_with_every_variant_and_reports_its_statistics(tiny_model, overrides):
    groups = make_groups(tiny_model, version=3)
    groups[0][0].versions = [v if v < 0 else 1 for v in groups[0][0].versions]  # one stale episode
    cfg = algo(stale="correct", max_staleness=1, **overrides)
    before = [p.detach().clone() for p in tiny_model.parameters()]
    stats = Learner(tiny_model, cfg, 1.0, 0).step(groups, version=3)
    assert stats["step_skipped"] == 0.0 and math.isfinite(stats["loss"])
    assert all(math.isfinite(stats[name]) for name in pg_stat_names(cfg))
    assert abs(stats["is_kl_k1"]) < 1e-6 and abs(stats["is_kl_k3"]) < 1e-6  # engine = learner here
    assert any(not torch.equal(a, b) for a, b in zip(before, tiny_model.parameters()))


def test_the_documented_settings_are_the_defaults():
    """docs/trainer.md lists every variant setting with its default: the block loads and matches the dataclass."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "trainer.md").read_text()
    block = text.split("## Policy-gradient variants")[1].split("```yaml\n")[1].split("```")[0]
    documented = yaml.safe_load(block)["algorithm"]
    cfg = config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": documented}).algorithm
    assert cfg == AlgorithmConfig()
    fields = set(PGParams.__dataclass_fields__) | {"pg_variant", "is_correction"}
    assert set(documented) == fields and set(documented["is_correction"]) == set(
        ISCorrectionConfig.__dataclass_fields__
    )
