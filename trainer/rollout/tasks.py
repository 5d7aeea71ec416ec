"""The task mixture: which env each episode group plays, drawn reproducibly, and how its env is built."""

from __future__ import annotations

import random
from typing import Any

from envhub.registry import make, spec
from envhub.remote import RemoteEnv
from envhub.trainer.config import TaskConfig
from envhub.trainer.rollout.worker import EnvFactory


class TaskSampler:
    """Draws (task, env seed) pairs from the weighted mixture, reproducibly from its own RNG."""

    def __init__(self, tasks: list[TaskConfig], seed: int) -> None:
        self.tasks = tasks
        self.rng = random.Random(seed)

    def sample(self) -> tuple[TaskConfig, int]:
        """The next task and the seed of its episode group."""
        task = self.rng.choices(self.tasks, weights=[t.weight for t in self.tasks])[0]
        return task, self.rng.randrange(2**31)

    def state(self) -> list[Any]:
        """JSON-serialisable RNG state."""
        version, internal, gauss = self.rng.getstate()
        return [version, list(internal), gauss]

    def load_state(self, state: list[Any]) -> None:
        """Restore the RNG state from `state()`."""
        self.rng.setstate((state[0], tuple(state[1]), state[2]))


def env_factory(task: TaskConfig) -> EnvFactory:
    """A zero-argument builder of the task's env, local or remote (rollout code cannot tell them apart)."""
    if task.remote:
        return lambda: RemoteEnv(task.remote, task.env, **task.kwargs)
    spec(task.env)  # fail early, with suggestions, on an unknown id
    return lambda: make(task.env, **task.kwargs)
