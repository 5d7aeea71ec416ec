"""An episode's recorded calls plus its reward as the `Trajectory`s the learner takes.

The merge rule: when every call's prompt starts with the previous call's prompt and output, token for token, the
episode is one trajectory, the last call's prompt plus output, with loss mask 1 exactly on each call's sampled
tokens (their logprobs and versions as the engine gave them) and a `TurnSpan` per call. Otherwise (a harness that
rewrites, trims or summarises its history) each call is its own sample: its prompt (mask 0) and output (mask 1),
carrying the episode's reward. `sample_advantages` gives every sample of an episode the episode's group advantage,
so an episode split into many samples counts once in its group's mean and spread; the split samples share one
`Trajectory.episode` key, from which the trainer's queue and learner do the same (`episodes_of`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from envhub.core import state_digest
from envhub.trainer.gateway.episodes import RecordedCall
from envhub.trainer.trajectory import FinishReason, Trajectory, TurnSpan


@dataclass(frozen=True)
class EpisodeSamples:
    """One harness episode as learner samples: one merged trajectory, or one per call."""

    trajectories: list[Trajectory]
    merged: bool
    reward: float
    calls: int


def extends(previous: RecordedCall, call: RecordedCall) -> bool:
    """Whether `call`'s prompt starts with `previous`'s prompt and output, token for token."""
    head = previous.prompt_ids + previous.output_ids
    return call.prompt_ids[: len(head)] == head


def _anchor(ids: Sequence[int]) -> str:
    """A key of what a call saw new (its prompt after the previous output), for step-level credit."""
    return "obs:" + state_digest(",".join(map(str, ids)).encode(), size=12)


def _merged(calls: list[RecordedCall], reward: float) -> tuple[list[int], list[int], list[float], list[int], list]:
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    spans = []
    for index, call in enumerate(calls):
        new = call.prompt_ids[len(ids) :]
        anchor = _anchor(new)
        ids += new
        mask += [0] * len(new)
        logprobs += [0.0] * len(new)
        versions += [-1] * len(new)
        start = len(ids)
        ids += call.output_ids
        mask += [1] * len(call.output_ids)
        logprobs += call.logprobs
        versions += call.versions
        last = index == len(calls) - 1
        spans.append(TurnSpan(start, len(ids), reward if last else 0.0, anchor))
    return ids, mask, logprobs, versions, spans


def to_trajectories(
    calls: Sequence[RecordedCall],
    reward: float,
    *,
    task: str,
    group_id: str = "",
    seed: int = 0,
    finish_reason: FinishReason = "terminated",
    env_info: dict | None = None,
    duration_s: float = 0.0,
    episode: str = "",
) -> EpisodeSamples:
    """The episode's samples under the merge rule (calls in their recorded order); no calls, no samples. Split
    samples share the key `episode` (a fresh one when empty): `Trajectory.episode`."""
    ordered = sorted(calls, key=lambda c: c.index)
    info = dict(env_info or {})
    log = [c.as_record() for c in ordered]

    def make(ids, mask, logprobs, versions, spans, turns: int, extra: dict) -> Trajectory:
        return Trajectory(
            input_ids=ids,
            loss_mask=mask,
            behavior_logprobs=logprobs,
            versions=versions,
            reward=reward,
            task=task,
            group_id=group_id,
            seed=seed,
            turns=turns,
            finish_reason=finish_reason,
            env_info={**info, **extra},
            duration_s=duration_s,
            turn_log=log if extra.get("merged", True) else [log[extra["sample"]]],
            turn_spans=spans,
            episode=key,
        )

    if not ordered:
        return EpisodeSamples([], False, reward, 0)
    merged = all(extends(a, b) for a, b in zip(ordered, ordered[1:]))
    key = episode or ("" if merged else uuid.uuid4().hex)
    if merged:
        fields = _merged(ordered, reward)
        return EpisodeSamples([make(*fields, len(ordered), {"merged": True})], True, reward, len(ordered))
    samples = []
    for index, call in enumerate(ordered):
        fields = _merged([call], reward)
        extra = {"merged": False, "sample": index, "samples": len(ordered)}
        samples.append(make(*fields, 1, extra))
    return EpisodeSamples(samples, False, reward, len(ordered))


def sample_advantages(group: Sequence[EpisodeSamples], scale_std: bool = True) -> list[list[float]]:
    """GRPO's group advantages over the group's episodes (one reward each, `group_advantages`), each handed to
    every sample of its episode."""
    import torch

    from envhub.trainer.learner.advantages import group_advantages

    if not group:
        return []
    rewards = torch.tensor([e.reward for e in group], dtype=torch.float32)
    advantages = group_advantages(rewards, len(group), scale_std=scale_std).tolist()
    return [[a] * len(e.trajectories) for a, e in zip(advantages, group)]
