"""The sandbox pools of the simulated env hosts: which acquires find a warm spare, and the creations the refills
set off (each one a load on its host while it runs, which the simulator starts as a `create` activity).

One pool per env host keeps `PoolModel.spares` sandboxes warm: an acquire takes a spare if there is one (no wait)
and otherwise waits for a cold start of its own; every sandbox taken or released makes the pool start creations
until spares plus those being created reach the target again. A cold start whose episode was cancelled (a spare
episode of a finished group) is not wasted: it becomes a spare when it finishes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from envhub.trainer.plan.model import PoolModel


@dataclass
class _HostPool:
    spares: int
    creating: int = 0  # creations under way that will become spares


@dataclass
class SandboxPools:
    """Warm spares and refills per env host; counts cold acquires and the seconds episodes waited."""

    model: PoolModel
    hosts: int
    rng: random.Random
    cold_acquires: int = 0
    waits: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._pools = [_HostPool(self.model.spares) for _ in range(self.hosts)]

    def create_s(self) -> float:
        """Seconds one sandbox start takes, drawn from the record's."""
        return self.rng.choice(self.model.create_s)

    def take(self, host: int) -> bool:
        """An acquire on `host`: True if a warm spare was taken (no wait), False if it needs a cold start."""
        pool = self._pools[host]
        if pool.spares:
            pool.spares -= 1
            self.waits.append(0.0)
            return True
        self.cold_acquires += 1
        return False

    def refills(self, host: int) -> int:
        """How many creations `host` starts now to get back to its spares (they count as under way)."""
        pool = self._pools[host]
        wanted = max(self.model.spares - pool.spares - pool.creating, 0)
        pool.creating += wanted
        return wanted

    def created(self, host: int) -> None:
        """A creation no episode waits for has finished: one more spare."""
        pool = self._pools[host]
        pool.creating -= 1
        pool.spares += 1

    def orphaned(self, host: int) -> None:
        """A cold start whose episode was cancelled carries on and will end as a spare."""
        self._pools[host].creating += 1

    def waited(self, seconds: float) -> None:
        """An episode got its sandbox from a cold start after `seconds`."""
        self.waits.append(seconds)

    @property
    def mean_wait_s(self) -> float:
        return sum(self.waits) / len(self.waits) if self.waits else 0.0
