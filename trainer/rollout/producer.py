"""The producer side of training: episode groups kept in flight within the queue's admission, each played by the
rollout source and offered to the queue when it ends."""

from __future__ import annotations

import asyncio
import traceback
from collections import defaultdict, deque

from envhub.trainer.config import TaskConfig
from envhub.trainer.rollout.queue import TrajectoryQueue
from envhub.trainer.rollout.sources import RolloutSource
from envhub.trainer.rollout.tasks import TaskSampler
from envhub.trainer.run.record import EpisodeRecorder


class RecentRewards:
    """Rewards of the latest finished episodes, per task and over all tasks (the reward curve's points)."""

    def __init__(self, window: int) -> None:
        self.by_task: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        self.overall: deque[float] = deque(maxlen=window)

    def add(self, task: str, reward: float) -> None:
        self.by_task[task].append(reward)
        self.overall.append(reward)

    def means(self) -> dict[str, float]:
        """{"all": mean over every task, task: mean, ...} over the window."""
        rows = {"all": sum(self.overall) / len(self.overall)} if self.overall else {}
        return rows | {task: sum(rs) / len(rs) for task, rs in self.by_task.items() if rs}


class GroupProducer:
    """Starts groups while the queue admits them (at most `concurrency` at once) and queues their outcome."""

    def __init__(
        self,
        source: RolloutSource,
        queue: TrajectoryQueue,
        sampler: TaskSampler,
        recorder: EpisodeRecorder,
        concurrency: int,
        reward_window: int,
    ) -> None:
        self.source, self.queue, self.sampler, self.recorder = source, queue, sampler, recorder
        self.concurrency = concurrency
        self.rewards = RecentRewards(reward_window)
        self.in_flight: set[asyncio.Task[None]] = set()
        self.step = 0  # the learner step new group ids are labelled with
        self.started = 0  # groups started over the whole run (a resumed run continues the count): ids stay unique

    async def run(self) -> None:
        """Start groups forever (cancel the task running this to stop)."""
        limit = asyncio.Semaphore(self.concurrency)
        while True:
            await limit.acquire()
            await self.queue.admit()
            task, seed = self.sampler.sample()
            self.started += 1
            group = asyncio.create_task(self._play(task, seed, f"{self.step}-{self.started}"))
            self.in_flight.add(group)
            group.add_done_callback(lambda done: (self.in_flight.discard(done), limit.release()))

    async def _play(self, task: TaskConfig, seed: int, group_id: str) -> None:
        try:
            group = await self.source.play_group(task, seed, group_id)
        except Exception:  # a crashed group must still give back its admission slot, or the loop can hang
            traceback.print_exc()
            group = None
        for trajectory in group or []:
            self.rewards.add(trajectory.task, trajectory.reward)
        outcome = await self.queue.put(group)
        if outcome != "accepted":
            self.recorder.group(group_id, task.env, outcome, self.queue.version)

    async def cancel_in_flight(self) -> None:
        """Cancel the groups still playing and wait until they are gone."""
        for group in list(self.in_flight):
            group.cancel()
        await asyncio.gather(*self.in_flight, return_exceptions=True)
