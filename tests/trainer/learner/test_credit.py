"""Credit assignment (learner/credit.py) against numbers worked out by hand from each paper's equation.

Every expected value below was computed on paper (population std, eps 1e-6), not by calling envhub: GiGPO's eqs. 4-7
(episode advantage plus omega times the step advantage inside anchor groups), discounted turn returns normalised over
the group, and GRPO's episode advantage.
"""

from __future__ import annotations

import math

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.config import config_from_dict
from envhub.trainer.learner.credit import (
    CreditParams,
    anchor_share,
    credit_signal,
    discounted_returns,
    has_signal,
    token_advantages,
    turn_advantages,
    turns_of,
)
from envhub.trainer.learner.step import Learner
from envhub.trainer.rollout.queue import TrajectoryQueue
from envhub.trainer.trajectory import Trajectory, TurnSpan, anchor_key
from tests.trainer.learner.conftest import algo

S2 = math.sqrt(2.0)


def episode(anchors: list[str], rewards: list[float], prompt: int = 3, turn_tokens: int = 2, extra: float = 0.0):
    """An episode of len(anchors) turns: `prompt` prompt tokens, then per turn `turn_tokens` model tokens and one
    observation token."""
    ids, mask, spans = [7] * prompt, [0] * prompt, []
    for anchor, reward in zip(anchors, rewards):
        spans.append(TurnSpan(len(ids), len(ids) + turn_tokens, reward, anchor))
        ids += [5] * turn_tokens + [9]
        mask += [1] * turn_tokens + [0]
    n = len(ids)
    return Trajectory(
        ids, mask, [0.0] * n, [0] * n, sum(rewards) + extra, "t", "g", 0, len(anchors), "terminated", turn_spans=spans
    )


def close(got: list[list[float]], want: list[list[float]]) -> bool:
    return all(g == pytest.approx(w, abs=1e-4) for g, w in zip(got, want, strict=True))


# A reached the goal (s0 -> s1 -> s2, reward on the last turn); B wasted a move at s0 and never got there.
GROUP = [episode(["s0", "s1", "s2"], [0, 0, 1]), episode(["s0", "s0", "s1"], [0, 0, 0])]


def test_gigpo_matches_the_hand_computed_group():
    # returns (gamma 0.5): A [0.25, 0.5, 1], B [0, 0, 0]. Episode advantages +-1.
    # anchor s0 = {0.25, 0, 0}: mean 1/12, std sqrt(1/72) -> +sqrt(2), -1/sqrt(2), -1/sqrt(2)
    # anchor s1 = {0.5, 0}: +1, -1; anchor s2 = {1}: a singleton, 0
    got = turn_advantages(GROUP, CreditParams("gigpo", gamma=0.5))
    assert close(got, [[1 + S2, 2, 1], [-1 - 1 / S2, -1 - 1 / S2, -2]])
    # without the division by std: episode +-0.5; s0 {1/6, -1/12, -1/12}; s1 +-0.25
    got = turn_advantages(GROUP, CreditParams("gigpo", gamma=0.5, scale_std=False))
    assert close(got, [[0.5 + 1 / 6, 0.75, 0.5], [-0.5 - 1 / 12, -0.5 - 1 / 12, -0.75]])
    # omega scales the step part only
    got = turn_advantages(GROUP, CreditParams("gigpo", gamma=0.5, step_weight=0.5))
    assert close(got, [[1 + S2 / 2, 1.5, 1], [-1 - 0.5 / S2, -1 - 0.5 / S2, -1.5]])


def test_gigpo_finds_the_wasted_move_where_every_episode_succeeds():
    # both reach s1 and are rewarded; B spends an extra turn at s0. Episode advantages 0 (equal returns).
    group = [episode(["s0", "s1"], [0, 1]), episode(["s0", "s0", "s1"], [0, 0, 1])]
    # gamma 0.5: returns A [0.5, 1], B [0.25, 0.5, 1]; s0 = {0.5, 0.25, 0.5}: mean 5/12, std sqrt(1/72)
    got = turn_advantages(group, CreditParams("gigpo", gamma=0.5))
    assert close(got, [[1 / S2, 0], [-S2, 1 / S2, 0]])
    assert has_signal(group, CreditParams("gigpo", gamma=0.5))
    # discount 1: every return is 1, nothing to tell apart; grpo sees equal returns
    assert close(turn_advantages(group, CreditParams("gigpo", gamma=1.0)), [[0, 0], [0, 0, 0]])
    assert not has_signal(group, CreditParams("gigpo", gamma=1.0))
    assert not has_signal(group, CreditParams("grpo"))


def test_turn_returns_normalised_over_the_group():
    # gamma 0.5: returns [0.25, 0.5, 1, 0, 0, 0], mean 7/24
    got = turn_advantages(GROUP, CreditParams("turn", gamma=0.5, scale_std=False))
    assert close(got, [[0.25 - 7 / 24, 0.5 - 7 / 24, 1 - 7 / 24], [-7 / 24] * 3])
    # discount 1: every turn of A returns 1, of B 0: +-1 on each, which is grpo's answer here
    assert close(turn_advantages(GROUP, CreditParams("turn", gamma=1.0)), [[1, 1, 1], [-1, -1, -1]])
    assert close(turn_advantages(GROUP, CreditParams("grpo")), [[1, 1, 1], [-1, -1, -1]])


def test_all_equal_rewards_and_singletons_give_zero():
    group = [episode(["a", "b"], [0, 0.5]), episode(["c", "d"], [0, 0.5])]
    for name in ("grpo", "turn", "gigpo"):
        assert close(turn_advantages(group, CreditParams(name, gamma=1.0)), [[0, 0], [0, 0]])
    # a reward at the first turn credits that turn only: turn sees it, grpo (equal returns) does not
    early = [episode(["a", "b"], [0.5, 0]), episode(["c", "d"], [0.5, 0])]
    assert close(turn_advantages(early, CreditParams("turn", gamma=1.0)), [[1, -1], [1, -1]])
    assert close(turn_advantages(early, CreditParams("grpo")), [[0, 0], [0, 0]])
    # distinct anchors everywhere: gigpo is grpo
    distinct = [episode(["a", "b"], [0, 1]), episode(["c", "d"], [0, 0])]
    assert close(turn_advantages(distinct, CreditParams("gigpo", gamma=0.9)), [[1, 1], [-1, -1]])


def test_a_return_beyond_the_turns_counts_on_the_last_turn_and_spanless_episodes_are_one_turn():
    graded = episode(["s0", "s1"], [0, 0], extra=1.0)  # a grader's reward after the last turn
    assert [s.reward for s in turns_of(graded)] == [0, 1.0]
    assert discounted_returns([0, 1.0], 0.5) == [0.5, 1.0]
    bare = Trajectory([1, 2, 3, 4], [0, 1, 1, 0], [0.0] * 4, [0] * 4, 0.7, "t", "g", 0, 1, "terminated")
    (only,) = turns_of(bare)
    assert (only.start, only.end, only.reward) == (1, 3, 0.7)


def test_token_advantages_put_each_turn_on_its_own_tokens():
    traj = GROUP[0]  # prompt 3, then turns at 3:5, 6:8, 9:11 with an observation token after each
    values = token_advantages(traj, [1.0, 2.0, 3.0])
    assert values.tolist() == [0, 0, 0, 1, 1, 0, 2, 2, 0, 3, 3, 0]
    with pytest.raises(ValueError, match="outside"):
        Trajectory([1], [1], [0.0], [0], 0.0, "t", "g", 0, 1, "terminated", turn_spans=[TurnSpan(0, 2, 0.0, "a")])


def test_anchor_share_counts_turns_in_groups_of_two_or_more():
    share, turns = anchor_share([GROUP])
    assert turns == 6 and share == pytest.approx(5 / 6)  # s0 x3, s1 x2, s2 alone
    share, _ = anchor_share([[episode(["a"], [1]), episode(["b"], [0])]])
    assert share == 0.0


def test_anchor_key_prefers_the_env_and_falls_back_to_the_observation():
    assert anchor_key({"anchor": "pos=1,2"}, "whatever") == "env:pos=1,2"
    assert anchor_key({"anchor": {"b": 1, "a": [2]}}, "") == anchor_key({"anchor": {"a": [2], "b": 1}}, "x")
    assert anchor_key({}, "board A") == anchor_key({}, "board A") != anchor_key({}, "board B")
    assert anchor_key({}, "board A").startswith("obs:")


def test_the_queue_keeps_a_group_only_gigpo_can_learn_from():
    group = [episode(["s0", "s1"], [0, 1]), episode(["s0", "s0", "s1"], [0, 0, 1])]
    cfg = algo(advantage="gigpo", gamma=0.5)

    async def offer(signal):
        queue = TrajectoryQueue(1, has_signal=signal)
        return await queue.put(list(group))

    import asyncio

    assert asyncio.run(offer(None)) == "filtered"  # grpo's rule: equal returns
    assert asyncio.run(offer(credit_signal(cfg))) == "accepted"
    assert credit_signal(algo()) is None


def test_the_learner_trains_turns_with_their_own_advantages(tiny_model):
    """One learner step under gigpo: only turns with a nonzero advantage move the weights, and the step reports
    the anchor share."""
    group = [episode(["s0", "s1"], [0, 1]), episode(["s0", "s0", "s1"], [0, 0, 1])]
    for t in group:
        t.behavior_logprobs = [0.0] * len(t.input_ids)
    learner = Learner(tiny_model, algo(advantage="gigpo", gamma=0.5, max_initial_kl=0.0), 1.0, 0)
    batches, _ = learner._micro_batches([group], version=0)
    got = {tuple(mb.rows): mb.advantages for mb in batches}
    advantages = torch.cat([a[a != 0] for a in got.values()])
    assert sorted(advantages.tolist()) == pytest.approx(sorted([1 / S2] * 2 + [-S2] * 2 + [1 / S2] * 2), abs=1e-4)
    stats = learner.step([group], version=0)
    assert stats["anchor_share"] == 1.0 and stats["turns"] == 5.0  # s0 three times, s1 twice
    assert stats["grad_norm"] > 0


@pytest.mark.parametrize(
    "algorithm, message",
    [
        ({"advantage": "gipgo"}, "did you mean 'gigpo'"),
        ({"gamma": 0.0}, "gamma must be in"),
        ({"gamma": 1.5}, "gamma must be in"),
        ({"step_weight": -1}, "step_weight must be >= 0"),
    ],
)
def test_bad_credit_settings_are_clear_errors(algorithm, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": algorithm})
