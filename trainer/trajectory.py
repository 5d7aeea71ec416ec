"""`Trajectory`: one finished episode as the learner sees it (token ids, loss mask, logprobs, reward, turns)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from envhub.core import state_digest

FinishReason = Literal["terminated", "truncated", "max_turns", "max_tokens", "timeout", "error"]


@dataclass(frozen=True)
class TurnSpan:
    """One model turn of an episode, for step-level credit (trainer/learner/credit.py).

    `start`:`end` is the turn's sampled tokens in `Trajectory.input_ids` (loss mask 1); `reward` what the env gave for
    the turn's action; `anchor` a key of the env state the turn acted in: the env's `info["anchor"]` when it gives
    one (docs/authoring.md, "Anchor states"), else `obs:` and a digest of the observation text the turn saw.
    """

    start: int
    end: int
    reward: float
    anchor: str


def anchor_key(info: dict[str, Any], observation: Any) -> str:
    """The anchor of the state a turn acts in: `env:` and the env's `info["anchor"]` (any JSON value, canonicalised),
    else `obs:` and a digest of the observation text (exact only when the text holds no turn counter or history)."""
    given = info.get("anchor") if isinstance(info, dict) else None
    if given is not None:
        return "env:" + (given if isinstance(given, str) else json.dumps(given, sort_keys=True, default=str))
    text = observation if isinstance(observation, str) else json.dumps(observation, sort_keys=True, default=str)
    return "obs:" + state_digest(text.encode("utf-8", "replace"), size=12)


@dataclass
class Trajectory:
    """A whole episode as one token sequence.

    `input_ids`, `loss_mask`, `behavior_logprobs` and `versions` have the same length. Prompt, env
    and tool tokens have loss mask 0, behaviour logprob 0.0 and version -1; model tokens have loss
    mask 1, the logprob the serving engine gave them and the policy version that sampled them.
    """

    input_ids: list[int]
    loss_mask: list[int]
    behavior_logprobs: list[float]
    versions: list[int]
    reward: float
    task: str
    group_id: str
    seed: int
    turns: int
    finish_reason: FinishReason
    env_info: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    turn_log: list[dict[str, Any]] = field(
        default_factory=list
    )  #: per turn: text, tool calls, observation, reward, timings (for the run record)
    turn_spans: list[TurnSpan] = field(default_factory=list)  #: per model turn: token span, reward, anchor
    #: the episode this is a sample of, when one episode gives several (a harness episode whose calls did not
    #: merge: one sample per call); "" = the trajectory is its whole episode
    episode: str = ""

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if not (len(self.loss_mask) == len(self.behavior_logprobs) == len(self.versions) == n):
            raise ValueError(
                f"trajectory fields differ in length: ids {n}, mask {len(self.loss_mask)}, "
                f"logprobs {len(self.behavior_logprobs)}, versions {len(self.versions)}"
            )
        for span in self.turn_spans:
            if not 0 <= span.start <= span.end <= n:
                raise ValueError(f"turn span {span.start}:{span.end} lies outside the trajectory's {n} tokens")

    @property
    def num_model_tokens(self) -> int:
        """How many tokens the policy produced (loss-mask 1)."""
        return sum(self.loss_mask)

    @property
    def oldest_version(self) -> int:
        """The oldest policy version among the model's tokens (-1 when it produced none)."""
        model_versions = [v for v, m in zip(self.versions, self.loss_mask) if m]
        return min(model_versions) if model_versions else -1


#: The samples of one task seed's episodes that GRPO normalises together: what the rollout hands the queue and the
#: learner. Most episodes are one trajectory; a split harness episode is several (`Trajectory.episode`, `episodes_of`).
Group = list[Trajectory]


def episodes_of(group: list[Trajectory]) -> list[list[Trajectory]]:
    """`group`'s samples by episode, in order of first appearance: samples sharing a non-empty `episode` are one
    episode; every other trajectory is an episode of its own. Group statistics (mean reward, advantages) count
    episodes, so an episode split into ten samples counts once."""
    by_key: dict[str, list[Trajectory]] = {}
    out: list[list[Trajectory]] = []
    for trajectory in group:
        if not trajectory.episode:
            out.append([trajectory])
        elif trajectory.episode in by_key:
            by_key[trajectory.episode].append(trajectory)
        else:
            by_key[trajectory.episode] = [trajectory]
            out.append(by_key[trajectory.episode])
    return out
