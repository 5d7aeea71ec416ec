"""The staleness rule of async training, decided in one place.

A model token is *stale* when the policy version that sampled it is older than `learner_version - max_staleness`.
The queue uses the rule to admit work (at most `max_staleness + 1` versions of groups in flight) and to drop a
finished group none of whose tokens the learner could use; the learner uses it to weigh each token: stale tokens
are masked out of the loss (`stale: drop`) or importance-corrected (`stale: correct`). A long multi-turn episode
therefore loses only its old tokens, never the whole episode. Sync training is the same rule with max_staleness 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

    from envhub.trainer.config import AlgorithmConfig
    from envhub.trainer.trajectory import Trajectory


@dataclass(frozen=True)
class Staleness:
    """How many policy versions a token may lag the learner, and what happens to tokens beyond that."""

    max_staleness: int = 0
    mode: Literal["drop", "correct"] = "drop"

    @classmethod
    def from_config(cls, algorithm: AlgorithmConfig) -> Staleness:
        """The rule a config asks for: async mode's `max_staleness`, sync mode 0."""
        bound = algorithm.max_staleness if algorithm.mode == "async" else 0
        return cls(max_staleness=bound, mode=algorithm.stale)

    def min_version(self, learner_version: int) -> int:
        """The oldest policy version whose tokens are still within the bound."""
        return learner_version - self.max_staleness

    def capacity(self, learner_version: int, groups_per_step: int) -> int:
        """How many groups may have been started (minus those discarded) while the learner is at `learner_version`."""
        return (learner_version + self.max_staleness + 1) * groups_per_step

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
