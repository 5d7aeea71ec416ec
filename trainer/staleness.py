"""The staleness rule of async training, decided in one place.

A model token is *stale* when the policy version that sampled it is older than `learner_version - max_staleness`
(the bound rounded up to whole versions).
The queue uses the rule to admit work (at most `max_staleness + 1` steps' worth of groups in flight) and to drop a
finished group none of whose tokens the learner could use; the learner uses it to weigh each token: stale tokens
are masked out of the loss (`stale: drop`) or importance-corrected (`stale: correct`). A long multi-turn episode
therefore loses only its old tokens, never the whole episode. Sync training is the same rule with max_staleness 0.

The bound may be fractional (verl's `staleness_threshold`, "0.x-step" asynchrony): at 0.5 with 4 groups a step, 2
groups of step v+1 may start on version v once the learner has taken its batch for step v, and the other 2 wait for
v+1. Tokens may then lag by `ceil(max_staleness)` whole versions; only the admission is finer.

Spare groups (`algorithm.spare_groups`, DAPO's over-sampling for its dynamic-sampling filter) are admitted beyond
the bound while the learner waits for its batch, so a group the zero-variance filter throws away is already being
replaced when it ends; the learner takes the first usable groups to finish. No spare starts once the batch is taken:
it would play on weights about to be replaced. A spare still playing at the publish goes on with the new weights,
and its older tokens are stale by the rule above (masked, or the group dropped if none is new), as in async runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from envhub.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from envhub.trainer.trajectory import Trajectory


class StalenessSettings(Protocol):
    """The settings the rule reads (`AlgorithmConfig` has them; the config module validates with this rule)."""

    mode: Literal["async", "sync"]
    max_staleness: float
    stale: Literal["drop", "correct"]
    spare_groups: int


@dataclass(frozen=True)
class Staleness:
    """How many policy versions a token may lag the learner, and what happens to tokens beyond that."""

    max_staleness: float = 0
    mode: Literal["drop", "correct"] = "drop"
    spares: int = 0  #: groups admitted beyond the bound while the learner waits for its batch

    @classmethod
    def from_config(cls, algorithm: StalenessSettings) -> Staleness:
        """The rule a config asks for: async mode's `max_staleness`, sync mode 0, and the spare groups."""
        bound = algorithm.max_staleness if algorithm.mode == "async" else 0
        return cls(max_staleness=bound, mode=algorithm.stale, spares=algorithm.spare_groups)

    def check(self, groups_per_step: int, name: str = "algorithm.max_staleness") -> None:
        """ConfigError for a bound that is negative, or fractional yet too small to let one group start early, or a
        negative number of spares."""
        if self.spares < 0:
            raise ConfigError(
                f"algorithm.spare_groups must be >= 0, got {self.spares}",
                hint="0 (none), or about groups_per_step x the share of groups the zero-variance filter throws away",
            )
        if self.max_staleness < 0:
            raise ConfigError(f"{name} must be >= 0, got {self.max_staleness:g}")
        if self.max_staleness > 0 and self.groups_ahead(groups_per_step) == 0:
            raise ConfigError(
                f"{name} {self.max_staleness:g} x {groups_per_step} groups a step rounds down to 0 groups: no group "
                "of the next step may start before the learner publishes, which is sync training",
                hint=f"{1 / groups_per_step:g} (one group of the {groups_per_step} a step) or more, or sync mode",
            )

    @property
    def version_bound(self) -> int:
        """Whole policy versions a token may lag the learner: the bound rounded up."""
        return math.ceil(self.max_staleness)

    def groups_ahead(self, groups_per_step: int) -> int:
        """Groups beyond the learner's current step that may start early: `max_staleness` steps' worth, rounded down."""
        return math.floor(self.max_staleness * groups_per_step + 1e-9)  # 0.29 * 100 is 28.999...: count it as 29

    def min_version(self, learner_version: int) -> int:
        """The oldest policy version whose tokens are still within the bound."""
        return learner_version - self.version_bound

    def capacity(self, learner_version: int, groups_per_step: int, learning: bool = True) -> int:
        """How many groups may have been started (minus those discarded) while the learner is at `learner_version`.

        The whole steps of the bound are admitted at once; a fractional part's groups only while the learner trains
        on its batch for `learner_version` (`learning`). Admitted earlier, at the publish, they would run beside the
        groups that complete the learner's next batch, slowing them, instead of using the time the learner works.
        The spares only while the learner waits for that batch (not `learning`).
        """
        ahead = self.groups_ahead(groups_per_step)
        partial = ahead % groups_per_step  # the groups of the fractional part, beyond its whole steps
        return (learner_version + 1) * groups_per_step + ahead + (0 if learning else self.spares - partial)

    def stale_tokens(self, versions: torch.Tensor, loss_mask: torch.Tensor, learner_version: int) -> torch.Tensor:
        """Boolean mask of the model tokens older than the bound ([B, T] like `versions`)."""
        return (loss_mask > 0) & (versions < self.min_version(learner_version))

    def usable(self, group: Sequence[Trajectory], learner_version: int) -> bool:
        """Whether the learner can learn from `group`: always when correcting, else when a model token is in bound."""
        if self.mode == "correct":
            return True
        newest = max((v for t in group for v, m in zip(t.versions, t.loss_mask) if m), default=learner_version)
        return newest >= self.min_version(learner_version)

    @staticmethod
    def lag(group: Sequence[Trajectory], learner_version: int) -> int:
        """Learner version minus the oldest policy version that produced a token of `group`."""
        oldest = min((t.oldest_version for t in group if t.oldest_version >= 0), default=learner_version)
        return learner_version - oldest
