"""GRPO advantages and loss against plain per-element reference computations on fixed tensors."""

import math

import pytest
import torch

from envhub.trainer.learner.advantages import group_advantages, kl_k3, loss_stats
from tests.trainer.learner.reference_loss import policy_loss


def test_group_advantages_match_reference():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 3.0, 5.0])
    got = group_advantages(rewards, group_size=4)
    expected = []
    for g in range(2):
        group = rewards[g * 4 : (g + 1) * 4].tolist()
        mean = sum(group) / 4
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / 4)
        expected += [(r - mean) / (std + 1e-6) for r in group]
    assert torch.allclose(got, torch.tensor(expected), atol=1e-5)
    unscaled = group_advantages(rewards, group_size=4, scale_std=False)
    assert torch.allclose(unscaled, torch.tensor([0.5, -0.5, -0.5, 0.5, -0.5, -0.5, -0.5, 1.5]))


def test_zero_variance_group_has_zero_advantage():
    assert torch.equal(group_advantages(torch.tensor([2.0, 2.0, 2.0]), 3), torch.zeros(3))


def test_group_advantages_reject_ragged_groups():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.ones(5), 2)


def reference_loss(lp, blp, adv, mask, cl, ch, weights=None, ref=None, kl_coef=0.0):
    total, count = 0.0, 0
    for b in range(len(lp)):
        for t in range(len(lp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(lp[b][t] - blp[b][t])
            a = adv[b]
            term = -min(ratio * a, min(max(ratio, 1 - cl), 1 + ch) * a)
            if weights is not None:
                term *= weights[b][t]
            if ref is not None:
                d = ref[b][t] - lp[b][t]
                term += kl_coef * (math.exp(d) - d - 1)
            total += term
            count += 1
    return total / count


# Ratios chosen to land on both clip sides with both advantage signs: exp(0.5)=1.65 > 1.28 and
# exp(-0.5)=0.61 < 0.8, plus ratios inside the range.
LP = [[-1.0, -0.5, -2.0, -0.3], [-1.5, -1.0, -0.7, -9.0]]
BLP = [[-1.5, -0.5, -1.5, -0.4], [-1.0, -1.1, -0.2, -9.0]]
MASK = [[0, 1, 1, 1], [1, 1, 1, 0]]


@pytest.mark.parametrize("adv", [[1.0, -1.0], [-2.0, 0.5]])
def test_policy_loss_matches_reference_on_both_clip_sides(adv):
    got = policy_loss(torch.tensor(LP), torch.tensor(BLP), torch.tensor(adv), torch.tensor(MASK), 0.2, 0.28)
    assert got.item() == pytest.approx(reference_loss(LP, BLP, adv, MASK, 0.2, 0.28), abs=1e-6)
    # three of six masked tokens have ratio exp(-0.5) < 0.8; the masked 1.65 at [0, 0] must not count
    stats = loss_stats(torch.tensor(LP), torch.tensor(BLP), torch.tensor(MASK))
    assert stats.clip_fraction == pytest.approx(3 / 6)


def test_clip_sides_are_asymmetric():
    lp, blp, mask = torch.tensor([[0.5]]), torch.tensor([[0.0]]), torch.tensor([[1]])
    # A>0, ratio 1.65: clipped at 1 + clip_high
    assert policy_loss(lp, blp, torch.tensor([1.0]), mask, 0.2, 0.28).item() == pytest.approx(-1.28)
    # A<0, ratio 0.61: clipped at 1 - clip_low (pessimistic side is the clipped one)
    assert policy_loss(-lp, blp, torch.tensor([-1.0]), mask, 0.2, 0.28).item() == pytest.approx(0.8)
    # A<0, ratio 1.65: the unclipped value is the pessimistic one and stays
    assert policy_loss(lp, blp, torch.tensor([-1.0]), mask, 0.2, 0.28).item() == pytest.approx(math.exp(0.5))


def test_gradient_is_zero_where_clipped_and_flows_inside():
    lp = torch.tensor([[0.5, 0.1]], requires_grad=True)
    policy_loss(lp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2)).backward()
    assert lp.grad[0, 0] == 0.0 and lp.grad[0, 1] == pytest.approx(-math.exp(0.1) / 2)


def test_kl_and_truncated_importance_weights_match_reference():
    lp, blp, mask = torch.tensor(LP), torch.tensor(BLP), torch.tensor(MASK)
    proximal = torch.tensor([[-1.2, -0.6, -1.8, -0.3], [-1.1, -1.0, -0.5, -9.0]])
    ref = torch.tensor([[-1.1, -0.4, -2.2, -0.6], [-1.4, -0.9, -0.9, -8.0]])
    adv = [0.7, -1.3]
    got = policy_loss(
        lp, blp, torch.tensor(adv), mask, proximal_logprobs=proximal, tis_cap=1.1, ref_logprobs=ref, kl_coef=0.05
    )
    weights = [[min(math.exp(p - b), 1.1) for p, b in zip(pr, br)] for pr, br in zip(proximal.tolist(), BLP)]
    expected = reference_loss(
        LP, proximal.tolist(), adv, MASK, 0.2, 0.28, weights=weights, ref=ref.tolist(), kl_coef=0.05
    )
    assert got.item() == pytest.approx(expected, abs=1e-6)
    assert any(w == 1.1 for row in weights for w in row)  # the cap is exercised
    assert (kl_k3(lp, ref) >= 0).all() and kl_k3(lp, lp).abs().max() == 0


def sample(reward, episode=""):
    from envhub.trainer.trajectory import Trajectory

    return Trajectory([1, 2], [0, 1], [0.0, -1.0], [-1, 0], reward, "t", "g", 0, 1, "terminated", episode=episode)


def test_sample_advantages_count_each_episode_once_however_many_samples_it_split_into():
    from envhub.trainer.gateway import EpisodeSamples
    from envhub.trainer.gateway import sample_advantages as gateway_sample_advantages
    from envhub.trainer.learner.advantages import sample_advantages

    # episode a is one trajectory (reward 1); b split into three samples (reward 0); c into two (reward 0.5)
    group = [sample(1.0), sample(0.0, "b"), sample(0.5, "c"), sample(0.0, "b"), sample(0.0, "b"), sample(0.5, "c")]
    per_episode = group_advantages(torch.tensor([1.0, 0.0, 0.5]), 3)
    a, b, c = per_episode.tolist()
    assert sample_advantages(group).tolist() == pytest.approx([a, b, c, b, b, c])
    assert b < 0 < a and c == pytest.approx(0.0, abs=1e-6)  # the mean is over episodes, not samples
    # the gateway's form (one EpisodeSamples per episode) gives the same numbers
    episodes = [EpisodeSamples([sample(1.0)], True, 1.0, 1), EpisodeSamples([sample(0.0)] * 3, False, 0.0, 3)]
    episodes.append(EpisodeSamples([sample(0.5)] * 2, False, 0.5, 2))
    assert sum(gateway_sample_advantages(episodes), []) == pytest.approx([a, b, b, b, c, c])
    # trajectories that are whole episodes: plain GRPO
    plain = [sample(r) for r in (1.0, 0.0, 0.0, 1.0)]
    assert torch.equal(sample_advantages(plain), group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4))
