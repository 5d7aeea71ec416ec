"""What `envhub plan` simulates and what a simulated run did: `PlanConfig` (resources, algorithm settings, length)
and `SimResult` (throughput, utilisations, staleness, stage times)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from envhub.errors import ConfigError
from envhub.trainer.staleness import Staleness


@dataclass(frozen=True)
class PlanConfig:
    """The pipeline to simulate: resources, algorithm settings and how long to run."""

    mode: Literal["sync", "async"] = "async"
    engines: int = 1
    env_hosts: int = 1
    learners: int = 1
    max_staleness: float = 1  # steps; fractional = part of a step's groups (envhub.trainer.staleness)
    stale: Literal["drop", "correct"] = "drop"
    redundancy: int = 0
    group_size: int = 4
    groups_per_step: int = 2
    concurrent_groups: int = 4
    steps: int = 10
    env_slots: int = 0  # episodes one env host runs at once (0 = no limit)
    resample: Literal["group", "episode"] = "group"
    seed: int = 0

    def validate(self) -> None:
        """ConfigError for settings no pipeline can have."""
        for name in ("engines", "env_hosts", "learners", "group_size", "groups_per_step", "steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("max_staleness", "redundancy", "concurrent_groups", "env_slots"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.mode == "async":
            Staleness(self.max_staleness).check(self.groups_per_step, "max-staleness")
        if self.mode not in ("sync", "async"):
            raise ConfigError(f"unknown mode {self.mode!r}", hint="sync or async")
        episodes = self.steps * self.groups_per_step * (self.group_size + self.redundancy)
        if episodes > 2_000_000 or self.engines > 10_000 or self.env_hosts > 100_000:
            raise ConfigError(
                f"a plan of {episodes} episodes on {self.engines} engines and {self.env_hosts} env hosts is too big "
                "to simulate here",
                hint="fewer --steps (throughput settles within tens of steps) or fewer engines / env hosts",
            )

    @property
    def staleness(self) -> Staleness:
        return Staleness(self.max_staleness if self.mode == "async" else 0, self.stale)


@dataclass
class SimResult:
    """What one simulated run did."""

    time_s: float
    steps: int
    episodes_trained: int
    episodes_started: int = 0
    episodes_cancelled: int = 0
    groups_filtered: int = 0
    groups_failed: int = 0
    groups_dropped: int = 0
    mean_staleness: float = 0.0
    engine_busy: float = 0.0  # share of the time an engine had a request running (mean over engines)
    engine_batch: float = 0.0  # mean requests running while busy
    env_busy: float = 0.0  # share of the time an env host ran a call (mean over hosts)
    env_calls: float = 0.0  # mean env calls running per host
    learner_busy: float = 0.0
    cold_acquires: int = 0
    acquire_wait_s: float = 0.0  # mean seconds an episode waited for its sandbox
    step_ends: list[float] = field(default_factory=list)
    stage_s: dict[str, float] = field(default_factory=dict)  # mean seconds per stage kind under the simulated load
    group_s: list[float] = field(default_factory=list)  # each finished group's time from start to its group_size-th

    @property
    def episodes_per_s(self) -> float:
        return self.episodes_trained / self.time_s if self.time_s else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.time_s if self.time_s else 0.0
