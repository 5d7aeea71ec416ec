"""Rollout sources: where the episodes of a GRPO group are played, and which of them form the group.

A source's `play_group(task, seed, group_id)` starts `group_size + redundancy` episodes of one task seed and keeps
the first `group_size` that finish without an error (`keep_first_finished`), cancelling the rest: over-provisioning
cuts the long tail. Every episode that ends, kept or not, is passed to the source's `on_episode` callback, so the run
record and the error counts see each one once, wherever it was played. `LocalRollouts` plays them on this process's
event loop; `envhub.trainer.rollout.ray_workers.RayRolloutSource` on Ray actors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from envhub.trainer.config import TaskConfig
from envhub.trainer.rollout.worker import EnvFactory, RolloutWorker
from envhub.trainer.trajectory import Trajectory

EpisodeCallback = Callable[[Trajectory], None]
T = TypeVar("T")


class RolloutSource(Protocol):
    """Plays GRPO groups; what the trainer's producer talks to."""

    on_episode: EpisodeCallback | None

    async def play_group(self, task: TaskConfig, seed: int, group_id: str) -> list[Trajectory] | None:
        """The group's kept episodes, or None when too few finished without an error."""

    async def close(self) -> None:
        """Release workers and connections."""


def _ran(trajectory: Trajectory) -> bool:
    return trajectory.finish_reason != "error"


async def keep_first_finished(
    episodes: Iterable[Awaitable[T]], want: int, ok: Callable[[T], bool] = _ran
) -> list[T] | None:
    """Run episodes concurrently; keep the first `want` that finish without an error (`ok`), cancel the rest.

    Returns None when fewer than `want` succeed.
    """
    pending = {asyncio.ensure_future(e) for e in episodes}
    kept: list[T] = []
    try:
        while pending and len(kept) < want:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            kept += [t.result() for t in done if t.exception() is None and ok(t.result())]
    finally:
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    return kept[:want] if len(kept) >= want else None


class LocalRollouts:
    """The default source: a `RolloutWorker` on the trainer's own event loop, one asyncio task per episode."""

    def __init__(self, worker: RolloutWorker, factories: dict[str, EnvFactory]) -> None:
        self.worker = worker
        self.factories = factories

    @property
    def on_episode(self) -> EpisodeCallback | None:
        return self.worker.on_episode

    @on_episode.setter
    def on_episode(self, callback: EpisodeCallback | None) -> None:
        self.worker.on_episode = callback

    async def play_group(self, task: TaskConfig, seed: int, group_id: str) -> list[Trajectory] | None:
        """`group_size + redundancy` episodes of `task` on `seed`; the first `group_size` to finish are kept."""
        config = self.worker.config
        make_env = self.factories[task.env]
        episodes = [
            self.worker.run_episode(make_env, task.env, seed, group_id, episode)
            for episode in range(config.group_size + config.redundancy)
        ]
        return await keep_first_finished(episodes, config.group_size)

    async def close(self) -> None:
        """Nothing to release: the engine belongs to the trainer."""


class MixedRollouts:
    """Routes each task's groups to the source that plays it: harness tasks (`TaskConfig.harness`) to
    `HarnessRollouts`, the others to the rollout loop's source."""

    def __init__(self, plain: RolloutSource, harness: RolloutSource) -> None:
        self.plain, self.harness = plain, harness

    @property
    def worker(self) -> Any:
        """The rollout loop's worker (progress counts its episodes)."""
        return getattr(self.plain, "worker", None)

    @property
    def on_episode(self) -> EpisodeCallback | None:
        return self.plain.on_episode

    @on_episode.setter
    def on_episode(self, callback: EpisodeCallback | None) -> None:
        self.plain.on_episode = self.harness.on_episode = callback

    async def play_group(self, task: TaskConfig, seed: int, group_id: str) -> list[Trajectory] | None:
        """The group from the task's source."""
        source = self.harness if task.harness is not None else self.plain
        return await source.play_group(task, seed, group_id)

    async def close(self) -> None:
        """Close both sources."""
        try:
            await self.harness.close()
        finally:
            await self.plain.close()
