"""The producer side of training: episode groups kept in flight within the queue's admission, each played by the
rollout source and offered to the queue when it ends.

The producer is the one place that feeds the run record: every episode that ends (kept or not, from this process
or a Ray worker) with the error counts beside it, and every group's outcome: filtered or failed here, dropped as
too stale by the queue, trained by the learner (`trained`)."""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import defaultdict, deque
from typing import Any

from envhub.trainer.config import TaskConfig
from envhub.trainer.rollout.queue import TrajectoryQueue
from envhub.trainer.rollout.sources import RolloutSource
from envhub.trainer.rollout.tasks import TaskSampler
from envhub.trainer.run.errors import TaskErrors
from envhub.trainer.run.record import EpisodeRecorder
from envhub.trainer.trajectory import Group, Trajectory, episodes_of


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
        errors: TaskErrors,
        concurrency: int,
        reward_window: int,
    ) -> None:
        self.source, self.queue, self.sampler, self.recorder = source, queue, sampler, recorder
        self.errors = errors
        source.on_episode = self._episode_ended
        queue.on_dropped = self._dropped
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
        for episode in episodes_of(group or []):  # a split harness episode's samples count once
            self.rewards.add(episode[0].task, episode[0].reward)
        outcome = await self.queue.put(group)
        if outcome in ("accepted", "filtered"):  # filtered: every reward equal, no signal for the learner
            self.sampler.observe(task, outcome == "accepted")
        if outcome != "accepted":
            self.recorder.group(group_id, task.env, outcome, self.queue.version)

    def _episode_ended(self, trajectory: Trajectory) -> None:
        self.recorder.episode(trajectory, self.queue.version)
        self.errors.observe(trajectory)

    def _dropped(self, group: Group) -> None:
        self.recorder.group(group[0].group_id, group[0].task, "dropped_stale", self.queue.version)

    def trained(self, groups: list[Group], step: int) -> None:
        """The learner took step `step` on `groups`: new groups are labelled with it, and the record says so."""
        self.step = step
        for group in groups:
            self.recorder.group(group[0].group_id, group[0].task, "trained", step)

    def close_record(self, step: int) -> None:
        """The run ends at `step`: groups still open are recorded as unfinished."""
        self.recorder.close(step)

    def progress(self, engine: Any) -> dict[str, Any]:
        """What is happening within the current learner step (for progress bars)."""
        worker = getattr(self.source, "worker", None)
        engine_tokens = getattr(getattr(engine, "stats", None), "tokens", None)
        elapsed = max(time.monotonic() - self.recorder.started, 1e-9)
        counters = self.queue.counters
        return {
            "episodes_running": getattr(worker, "episodes_running", None),
            "episodes_done": self.recorder.episodes_done,
            "groups_running": len(self.in_flight),
            "groups_accepted": counters.accepted,
            "groups_filtered": counters.filtered_zero_variance,
            "groups_dropped": counters.dropped_stale,
            "tokens_per_s": engine_tokens / elapsed if engine_tokens is not None else self.recorder.tokens_per_s(),
        }

    async def cancel_in_flight(self) -> None:
        """Cancel the groups still playing and wait until they are gone."""
        for group in list(self.in_flight):
            group.cancel()
        await asyncio.gather(*self.in_flight, return_exceptions=True)
