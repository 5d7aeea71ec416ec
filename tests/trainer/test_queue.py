"""TrajectoryQueue: staleness bound (admission and dropping), zero-variance filtering, counters."""

import asyncio

import pytest

from envhub.trainer.queue import TrajectoryQueue
from envhub.trainer.trajectory import Trajectory


def make_group(rewards, version, group_id="g"):
    return [
        Trajectory(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], behavior_logprobs=[0.0, -1.0, -1.0], versions=[-1, version, version],
                   reward=r, task="t", group_id=group_id, seed=0, turns=1, finish_reason="terminated")
        for r in rewards
    ]


async def test_admission_enforces_max_staleness():
    queue = TrajectoryQueue(groups_per_step=2, max_staleness=1)
    for _ in range(4):  # (0 + 1 + 1) * 2 groups may start at version 0
        await asyncio.wait_for(queue.admit(), 1)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(queue.admit(), 0.05)
    for i in range(2):
        await queue.put(make_group([0.0, 1.0], version=0, group_id=str(i)))
    batch, corrected = await queue.get_batch()
    assert len(batch) == 2 and not corrected
    await queue.set_version(1)
    await asyncio.wait_for(queue.admit(), 1)  # a step frees two more slots


async def test_sync_mode_admits_one_step_at_a_time():
    queue = TrajectoryQueue(groups_per_step=1, max_staleness=0)
    await queue.admit()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(queue.admit(), 0.05)


async def test_stale_groups_are_dropped_or_corrected_and_counted():
    queue = TrajectoryQueue(groups_per_step=1, max_staleness=1)
    await queue.set_version(3)
    await queue.put(make_group([0.0, 1.0], version=1, group_id="old"))  # staleness 2 > 1
    await queue.put(make_group([0.0, 1.0], version=2, group_id="ok"))   # staleness 1
    batch, corrected = await queue.get_batch()
    assert [g[0].group_id for g in batch] == ["ok"] and not corrected
    assert queue.counters.dropped_stale == 1

    correcting = TrajectoryQueue(groups_per_step=1, max_staleness=0, stale="correct")
    await correcting.set_version(2)
    await correcting.put(make_group([0.0, 1.0], version=1))
    batch, corrected = await correcting.get_batch()
    assert len(batch) == 1 and corrected and correcting.counters.corrected_stale == 1


async def test_zero_variance_groups_are_filtered_and_free_their_slot():
    queue = TrajectoryQueue(groups_per_step=1, max_staleness=0)
    await queue.admit()
    await queue.put(make_group([1.0, 1.0, 1.0], version=0))
    assert queue.counters.filtered_zero_variance == 1 and queue.counters.accepted == 0
    await asyncio.wait_for(queue.admit(), 1)  # the filtered group's slot is free again
    await queue.put(make_group([1.0, 0.0, 1.0], version=0))
    batch, _ = await queue.get_batch()
    assert batch[0][1].reward == 0.0
    unfiltered = TrajectoryQueue(groups_per_step=1, max_staleness=0, filter_zero_variance=False)
    await unfiltered.put(make_group([1.0, 1.0], version=0))
    assert unfiltered.counters.accepted == 1
