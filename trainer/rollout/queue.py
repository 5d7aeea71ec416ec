"""TrajectoryQueue: finished GRPO groups between rollouts and the learner, within the staleness bound.

Admission control keeps async training within the `Staleness` rule (`envhub.trainer.staleness`): a producer may
start a group only while started-and-not-discarded groups stay below (learner_version + max_staleness + 1) *
groups_per_step (rounded down; a fractional bound's part once the learner has taken its batch). With max_staleness
= 0 this is synchronous training: rollouts for version v+1 cannot start before the learner has published v+1. A
finished group none of whose tokens the learner could use is dropped; the learner weighs the tokens of the others.
Episodes cut by the wall-time watchdog leave their group (their 0 reward says the env was slow, not that the policy
failed); groups whose rewards agree within a tolerance carry no GRPO signal and are filtered. Every such decision
is counted.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

from envhub.trainer.staleness import Staleness
from envhub.trainer.trajectory import Group, episodes_of


@dataclass
class QueueCounters:
    """What happened to the groups that went through the queue."""

    started: int = 0
    accepted: int = 0
    consumed: int = 0
    dropped_stale: int = 0
    corrected_stale: int = 0
    filtered_zero_variance: int = 0
    failed: int = 0
    timed_out_episodes: int = 0
    timed_out_groups: int = 0

    def as_dict(self) -> dict[str, int]:
        """Plain dict (metrics, checkpoints)."""
        return asdict(self)


class TrajectoryQueue:
    """Groups complete independently; the learner takes them in finishing order."""

    def __init__(
        self,
        groups_per_step: int,
        staleness: Staleness | None = None,
        filter_zero_variance: bool = True,
        zero_variance_tol: float = 1e-6,
        max_reward: float = 1.0,
        has_signal: Callable[[Group], bool] | None = None,
    ) -> None:
        self.groups_per_step = groups_per_step
        # a step-level estimator finds signal in a group whose returns are equal (turns of different worth)
        self.has_signal = has_signal
        self.staleness = staleness or Staleness()
        self.filter_zero_variance = filter_zero_variance
        self.zero_variance_tol = zero_variance_tol
        self.max_reward = max_reward
        self.version = 0
        self.counters = QueueCounters()
        self.solved_in_a_row = 0  # zero-variance groups at max_reward since the last group with signal
        self.stuck_in_a_row = 0  # zero-variance groups below max_reward (e.g. every episode fails)
        self.collapsed_in_a_row = 0  # the latest of those in a row whose episodes all played the same tokens
        self.first_rewards: list[float] = []  # mean reward of the first groups_per_step groups, for stop messages
        self.last_reward = 0.0  # mean reward of the latest group
        self._ready: deque[Group] = deque()
        self._discarded = 0
        self._batch_taken_at = -1  # the learner version that last took a batch: it trains while this is current
        self._changed = asyncio.Condition()
        self.on_dropped: Callable[[Group], None] | None = None  # sees each group dropped as too stale (run record)

    def capacity(self) -> int:
        """How many groups may have been started (minus those discarded) at the current version."""
        learning = self._batch_taken_at == self.version
        return self.staleness.capacity(self.version, self.groups_per_step, learning)

    async def admit(self) -> None:
        """Wait until one more group may start without breaking the staleness bound."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.counters.started - self._discarded < self.capacity())
            self.counters.started += 1

    async def _discard(self) -> None:
        self._discarded += 1
        self._changed.notify_all()

    @property
    def filtered_in_a_row(self) -> int:
        """Zero-variance groups since the last group with signal."""
        return self.solved_in_a_row + self.stuck_in_a_row

    def stop_reason(self, limit: int) -> str | None:
        """Why training should stop after `limit` signal-less groups in a row, or None."""
        if self.solved_in_a_row >= limit:
            return (
                f"converged: the last {self.solved_in_a_row} groups all reached the maximum reward {self.max_reward:g}"
            )
        if self.stuck_in_a_row < limit:
            return None
        history = f"reward {self.start_reward:.2f} -> {self.last_reward:.2f}"
        if self.collapsed_in_a_row >= limit:
            return (
                f"collapsed to one reply; {history}: in each of the last {self.collapsed_in_a_row} groups every "
                f"episode played the same tokens, so no group has a learning signal left; lower algorithm.lr or "
                f"raise rollout.temperature to keep the replies varied"
            )
        collapsed = self.collapsed_in_a_row
        example = f"the last {collapsed} of them one reply throughout" if collapsed else "e.g. every episode fails"
        return (
            f"no learning signal; {history}: in each of the last {self.stuck_in_a_row} groups every episode got the "
            f"same reward below the maximum {self.max_reward:g} ({example}); check the env, the prompt or "
            f"max_new_tokens"
        )

    @property
    def start_reward(self) -> float:
        """Mean reward of the first groups (the start of the reward history in stop messages)."""
        return sum(self.first_rewards) / len(self.first_rewards) if self.first_rewards else 0.0

    def _note_rewards(self, group: Group) -> None:
        episodes = episodes_of(group)  # a split harness episode's samples count once
        self.last_reward = sum(e[0].reward for e in episodes) / len(episodes)
        if len(self.first_rewards) < self.groups_per_step:
            self.first_rewards.append(self.last_reward)

    async def put(self, group: Group | None) -> str:
        """Offer a finished group (None for a group whose episodes failed; timed-out episodes leave it).

        Returns what became of it: timed_out, failed, filtered or accepted."""
        async with self._changed:
            if group is not None:
                kept = [t for t in group if t.finish_reason != "timeout"]
                self.counters.timed_out_episodes += len(group) - len(kept)
                if len(kept) < min(2, len(group)):  # one episode cannot be compared with anything
                    self.counters.timed_out_groups += 1
                    await self._discard()
                    return "timed_out"
                group = kept
            if group is None:
                self.counters.failed += 1
                await self._discard()
                return "failed"
            self._note_rewards(group)
            if self.filter_zero_variance and not self._signal(group):
                self.counters.filtered_zero_variance += 1
                if group[0].reward >= self.max_reward - self.zero_variance_tol:
                    self.solved_in_a_row, self.stuck_in_a_row, self.collapsed_in_a_row = self.solved_in_a_row + 1, 0, 0
                else:
                    self.solved_in_a_row, self.stuck_in_a_row = 0, self.stuck_in_a_row + 1
                    one_reply = len({tuple(tuple(t.input_ids) for t in e) for e in episodes_of(group)}) == 1
                    self.collapsed_in_a_row = self.collapsed_in_a_row + 1 if one_reply else 0
                await self._discard()
                return "filtered"
            self.counters.accepted += 1
            self.solved_in_a_row = self.stuck_in_a_row = self.collapsed_in_a_row = 0
            self._ready.append(group)
            self._changed.notify_all()
            return "accepted"

    def _signal(self, group: Group) -> bool:
        if self.has_signal is not None:
            return self.has_signal(group)
        return max(t.reward for t in group) - min(t.reward for t in group) > self.zero_variance_tol

    def lag(self, group: Group) -> int:
        """Learner version minus the oldest policy version that produced a token of `group`."""
        return Staleness.lag(group, self.version)

    async def get_batch(self, n_groups: int | None = None) -> list[Group]:
        """Wait for `n_groups` groups the learner can use; a group with no token within the bound is dropped."""
        n_groups = n_groups or self.groups_per_step
        batch: list[Group] = []
        async with self._changed:
            while len(batch) < n_groups:
                await self._changed.wait_for(lambda: bool(self._ready))
                group = self._ready.popleft()
                if not self.staleness.usable(group, self.version):
                    self.counters.dropped_stale += 1
                    await self._discard()
                    if self.on_dropped is not None:
                        self.on_dropped(group)
                    continue
                if self.staleness.mode == "correct" and self.lag(group) > self.staleness.version_bound:
                    self.counters.corrected_stale += 1  # the learner importance-corrects its stale tokens
                batch.append(group)
            self.counters.consumed += len(batch)
            self._batch_taken_at = self.version
            self._changed.notify_all()  # a fractional bound admits the next step's early groups now
        return batch

    async def set_version(self, version: int) -> None:
        """The learner published `version`: admit the rollouts it allows."""
        async with self._changed:
            self.version = version
            self._changed.notify_all()

    def state(self) -> dict[str, int]:
        """Counters and version for checkpoints."""
        return {"version": self.version, **self.counters.as_dict()}

    def load_state(self, state: dict[str, int]) -> None:
        """Restore counters from a checkpoint; admission restarts from the restored version."""
        self.version = int(state.get("version", 0))
        self.counters = QueueCounters(
            **{k: int(v) for k, v in state.items() if k in QueueCounters.__dataclass_fields__}
        )
        self.counters.started = self.counters.consumed
        self._discarded = self.counters.consumed - self.version * self.groups_per_step
