"""TrajectoryQueue: staleness bound (admission and dropping), zero-variance filtering, counters."""

import asyncio

import pytest

from envhub.trainer.rollout.queue import TrajectoryQueue
from envhub.trainer.staleness import Staleness
from envhub.trainer.trajectory import Trajectory


def make_group(rewards, version, group_id="g"):
    return [
        Trajectory(
            input_ids=[1, 2, 3],
            loss_mask=[0, 1, 1],
            behavior_logprobs=[0.0, -1.0, -1.0],
            versions=[-1, version, version],
            reward=r,
            task="t",
            group_id=group_id,
            seed=0,
            turns=1,
            finish_reason="terminated",
        )
        for r in rewards
    ]


async def admits(queue, n):
    """`n` more groups are admitted at once, and then none."""
    for _ in range(n):
        await asyncio.wait_for(queue.admit(), 1)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(queue.admit(), 0.05)


async def test_admission_enforces_max_staleness():
    queue = TrajectoryQueue(groups_per_step=2, staleness=Staleness(1))
    for _ in range(4):  # (0 + 1 + 1) * 2 groups may start at version 0
        await asyncio.wait_for(queue.admit(), 1)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(queue.admit(), 0.05)
    for i in range(2):
        await queue.put(make_group([0.0, 1.0], version=0, group_id=str(i)))
    batch = await queue.get_batch()
    assert len(batch) == 2
    await queue.set_version(1)
    await asyncio.wait_for(queue.admit(), 1)  # a step frees two more slots


async def test_a_fractional_bound_lets_part_of_the_next_step_start_while_the_learner_trains():
    # verl's staleness_threshold: at 0.5 with 4 groups a step, 2 groups of step 1 may start on version 0, once the
    # learner has taken its step-0 batch (before that they would only slow the step-0 groups down)
    queue = TrajectoryQueue(groups_per_step=4, staleness=Staleness(0.5))

    await admits(queue, 4)
    for i in range(4):
        await queue.put(make_group([0.0, 1.0], version=0, group_id=str(i)))
    assert len(await queue.get_batch()) == 4
    await admits(queue, 2)  # the learner trains on step 0: half of step 1 starts on version 0
    await queue.set_version(1)
    await admits(queue, 2)  # published: the rest of step 1 on version 1, and none of step 2 until that batch is taken
    # a group started early is one version old when it is used: within the bound, rounded up to whole versions
    await queue.put(make_group([0.0, 1.0], version=0, group_id="early"))
    await queue.put(make_group([0.0, 1.0], version=-1, group_id="older"))  # two versions old: nothing usable
    for i in range(3):
        await queue.put(make_group([0.0, 1.0], version=1, group_id=f"fresh{i}"))
    batch = await queue.get_batch()
    assert [g[0].group_id for g in batch] == ["early", "fresh0", "fresh1", "fresh2"]
    assert queue.counters.dropped_stale == 1
    await admits(queue, 3)  # the dropped group gave its slot back, and step 2's early half may start


@pytest.mark.parametrize(
    "bound, groups_per_step, ahead, versions",
    [(0, 4, 0, 0), (0.25, 4, 1, 1), (0.5, 4, 2, 1), (1, 4, 4, 1), (1.5, 2, 3, 2), (0.29, 100, 29, 1), (0.1, 4, 0, 1)],
)
def test_staleness_counts_groups_ahead_rounded_down_and_versions_rounded_up(bound, groups_per_step, ahead, versions):
    rule = Staleness(bound)
    assert rule.groups_ahead(groups_per_step) == ahead and rule.version_bound == versions
    assert rule.capacity(3, groups_per_step) == 4 * groups_per_step + ahead
    whole = int(bound) * groups_per_step  # before the learner takes its batch, only whole steps are admitted
    assert rule.capacity(3, groups_per_step, learning=False) == 4 * groups_per_step + whole
    assert rule.min_version(3) == 3 - versions


async def test_sync_mode_admits_one_step_at_a_time():
    queue = TrajectoryQueue(groups_per_step=1, staleness=Staleness(0))
    await queue.admit()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(queue.admit(), 0.05)


async def test_spare_groups_start_while_the_learner_waits_and_replace_filtered_ones():
    """DAPO's over-sampling: sync mode with 2 groups a step and 2 spares keeps 4 groups playing for the batch; none
    starts while the learner trains; a spare still playing at the publish goes on, its old tokens stale."""
    queue = TrajectoryQueue(groups_per_step=2, staleness=Staleness(0, spares=2))

    await admits(queue, 4)
    await queue.put(make_group([1.0, 1.0], version=0, group_id="filtered"))
    await admits(queue, 1)  # its replacement starts at once, beside the three still playing
    await queue.put(make_group([0.0, 1.0], version=0, group_id="a"))
    await queue.put(make_group([1.0, 0.0], version=0, group_id="b"))
    assert [g[0].group_id for g in await queue.get_batch()] == ["a", "b"]
    await admits(queue, 0)  # the learner trains: two spares still play on version 0, and nothing more starts
    await queue.put(make_group([0.0, 1.0], version=0, group_id="late"))  # done before the publish: all stale
    await queue.set_version(1)
    await admits(queue, 2)  # step 1's two groups and two spares, less the spare still playing and the one waiting
    mixed = make_group([0.0, 1.0], version=1, group_id="mixed")
    for trajectory in mixed:  # a spare whose first turn was sampled before the publish
        trajectory.versions = [-1, 0, 1]
    await queue.put(mixed)
    await queue.put(make_group([1.0, 0.0], version=1, group_id="fresh"))
    assert [g[0].group_id for g in await queue.get_batch()] == ["mixed", "fresh"]
    assert queue.counters.dropped_stale == 1  # "late": every token one version old, in sync mode


@pytest.mark.parametrize("bound, learning, capacity", [(0, False, 8), (0, True, 6), (1, False, 10), (1, True, 8)])
def test_spares_add_to_the_capacity_only_while_the_learner_waits(bound, learning, capacity):
    assert Staleness(bound, spares=2).capacity(2, 2, learning) == capacity


async def test_stale_groups_are_dropped_or_corrected_and_counted():
    queue = TrajectoryQueue(groups_per_step=1, staleness=Staleness(1))
    await queue.set_version(3)
    await queue.put(make_group([0.0, 1.0], version=1, group_id="old"))  # staleness 2 > 1
    await queue.put(make_group([0.0, 1.0], version=2, group_id="ok"))  # staleness 1
    batch = await queue.get_batch()
    assert [g[0].group_id for g in batch] == ["ok"] and queue.counters.corrected_stale == 0
    assert queue.counters.dropped_stale == 1

    correcting = TrajectoryQueue(groups_per_step=1, staleness=Staleness(0, "correct"))
    await correcting.set_version(2)
    await correcting.put(make_group([0.0, 1.0], version=1))
    batch = await correcting.get_batch()
    assert len(batch) == 1 and correcting.counters.corrected_stale == 1


async def test_zero_variance_groups_are_filtered_and_free_their_slot():
    queue = TrajectoryQueue(groups_per_step=1, staleness=Staleness(0))
    await queue.admit()
    await queue.put(make_group([1.0, 1.0, 1.0], version=0))
    assert queue.counters.filtered_zero_variance == 1 and queue.counters.accepted == 0
    await asyncio.wait_for(queue.admit(), 1)  # the filtered group's slot is free again
    await queue.put(make_group([1.0, 0.0, 1.0], version=0))
    batch = await queue.get_batch()
    assert batch[0][1].reward == 0.0
    unfiltered = TrajectoryQueue(groups_per_step=1, staleness=Staleness(0), filter_zero_variance=False)
    await unfiltered.put(make_group([1.0, 1.0], version=0))
    assert unfiltered.counters.accepted == 1


def timed(group, reasons):
    for traj, reason in zip(group, reasons):
        traj.finish_reason = reason
    return group


async def test_timed_out_episodes_leave_their_group_and_are_counted():
    queue = TrajectoryQueue(groups_per_step=1, staleness=Staleness(0))
    await queue.admit()
    await queue.put(
        timed(make_group([0.0, 1.0, 0.0, 1.0], version=0), ["terminated", "timeout", "terminated", "terminated"])
    )
    batch = await queue.get_batch()
    assert [t.reward for t in batch[0]] == [0.0, 0.0, 1.0] and queue.counters.timed_out_episodes == 1
    await queue.set_version(1)
    await queue.admit()
    await queue.put(timed(make_group([0.0, 1.0], version=1), ["timeout", "terminated"]))  # one left: nothing to compare
    assert queue.counters.timed_out_groups == 1 and queue.counters.accepted == 1
    await asyncio.wait_for(queue.admit(), 1)  # its slot came back


async def test_zero_variance_uses_a_tolerance():
    queue = TrajectoryQueue(groups_per_step=1, staleness=Staleness(0), zero_variance_tol=1e-4)
    await queue.put(make_group([0.5, 0.5 + 1e-6, 0.5], version=0))
    assert queue.counters.filtered_zero_variance == 1


def replies(group, texts):
    """`group` with each episode's reply tokens set (tokens 1, 2 are the prompt)."""
    for t, reply in zip(group, texts):
        t.input_ids, t.loss_mask = [1, 2, *reply], [0, 0, *[1] * len(reply)]
        t.behavior_logprobs, t.versions = [0.0] * len(t.input_ids), [-1, -1, *[0] * len(reply)]
    return group


async def test_converged_only_at_max_reward_and_a_separate_stop_when_everything_fails():
    queue = TrajectoryQueue(groups_per_step=1, staleness=Staleness(5), max_reward=1.0)
    for _ in range(3):
        await queue.put(replies(make_group([0.0, 0.0], version=0), [[5], [6, 7]]))  # different replies, both fail
    reason = queue.stop_reason(3)
    assert reason.startswith("no learning signal") and "every episode fails" in reason and "converged" not in reason
    await queue.put(make_group([0.0, 1.0], version=0))  # a group with signal resets both counts
    assert queue.stop_reason(1) is None
    for _ in range(2):
        await queue.put(make_group([1.0, 1.0], version=0))
    assert queue.stop_reason(3) is None and queue.stop_reason(2).startswith("converged")


async def test_a_policy_collapsed_to_one_reply_is_named_with_its_reward_history():
    queue = TrajectoryQueue(groups_per_step=2, staleness=Staleness(5), max_reward=1.0)
    await queue.put(replies(make_group([0.3, 0.4], version=0), [[5], [6]]))  # the start: replies vary
    await queue.put(replies(make_group([0.4, 0.4], version=0), [[5, 6], [6, 5]]))  # same reward, other replies
    for _ in range(3):  # then every episode plays the same reply, whose reward is 2/3
        await queue.put(replies(make_group([2 / 3] * 4, version=0), [[9, 9, 9]] * 4))
    reason = queue.stop_reason(3)
    assert reason.startswith("collapsed to one reply; reward 0.38 -> 0.67") and "every episode fails" not in reason
    await queue.put(replies(make_group([0.5] * 2, version=0), [[9, 9], [8, 8]]))  # varied replies scored alike
    await queue.put(replies(make_group([2 / 3] * 2, version=0), [[9, 9, 9]] * 2))
    reason = queue.stop_reason(3)
    assert (
        reason.startswith("no learning signal; reward 0.38 -> 0.67")
        and "the last 1 of them one reply throughout" in reason
    )


async def test_long_episode_with_fresh_tokens_is_kept_and_all_old_is_dropped():
    queue = TrajectoryQueue(groups_per_step=1, staleness=Staleness(1))
    await queue.set_version(5)
    long = make_group([0.0, 1.0], version=2)
    for traj in long:  # a multi-turn episode: first turn at version 2, last turn at version 5
        traj.input_ids, traj.loss_mask, traj.behavior_logprobs, traj.versions = (
            [1, 2, 3, 4],
            [0, 1, 0, 1],
            [0.0] * 4,
            [-1, 2, -1, 5],
        )
    await queue.put(make_group([0.0, 1.0], version=2, group_id="old"))
    await queue.put(long)
    batch = await queue.get_batch()
    assert batch == [long] and queue.counters.dropped_stale == 1 and queue.staleness.min_version(queue.version) == 4


async def test_a_split_episode_counts_once_in_its_group():
    import dataclasses

    queue = TrajectoryQueue(groups_per_step=1)
    whole, split = make_group([1.0, 0.0], 0)
    # the second episode split into three samples (a harness whose calls did not merge)
    samples = [dataclasses.replace(split, episode="e", input_ids=[1, 2, i]) for i in range(3)]
    assert await queue.put([whole, *samples]) == "accepted"
    assert queue.last_reward == 0.5  # the mean of two episodes, not of four samples
    # two episodes that played the same tokens, one of them split: one reply, whatever the samples
    same = [dataclasses.replace(t, reward=0.0) for t in (whole, whole)]
    assert await queue.put([same[0], *[dataclasses.replace(s, reward=0.0) for s in samples]]) == "filtered"
    assert queue.collapsed_in_a_row == 0  # the episodes differ (one is three samples)
    assert await queue.put(same) == "filtered" and queue.collapsed_in_a_row == 1
