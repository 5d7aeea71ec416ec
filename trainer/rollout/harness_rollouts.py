"""Harness tasks' rollouts: each episode of a group is an external agent program (`HarnessEnv`) whose model calls go
through the recording gateway in front of the trainer's own engine; its recorded calls become the group's samples.

An episode whose calls merge is one trajectory; one whose calls do not is one sample per call, the samples sharing
the episode's key (`Trajectory.episode`), so the queue and the learner count it once (`episodes_of`). The run record
gets one line per episode, whatever became of it: its calls (prompt and output ids, logprobs, versions) in `log`
(entries of kind "call"), and `env_info` saying which harness played it, whether its calls merged and into how many
samples. A program that failed after calling the model is dropped from its group, or trained with reward 0 under
`harness_errors: zero`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from envhub.trainer.config import RolloutConfig, TaskConfig
from envhub.trainer.gateway import Gateway, GatewayConfig, to_trajectories
from envhub.trainer.harness import HarnessEnv, HarnessEpisode
from envhub.trainer.rollout.sources import EpisodeCallback, keep_first_finished
from envhub.trainer.rollout.tasks import env_factory
from envhub.trainer.trajectory import Trajectory


def gateway_config(rollout: RolloutConfig) -> GatewayConfig:
    """The gateway's limits from the rollout's: a call's tokens, its context, the episode's sampled tokens (as many
    as the rollout loop's max_turns turns could sample), and the training temperature whatever the program asks
    (the recorded logprobs must be the policy's at the temperature the learner uses)."""
    return GatewayConfig(
        max_tokens_per_request=rollout.max_new_tokens,
        max_context_tokens=rollout.max_total_tokens,
        episode_token_budget=rollout.max_turns * rollout.max_new_tokens,
        temperature=rollout.temperature,
    )


class HarnessRollouts:
    """Plays the groups of harness tasks (`TaskConfig.harness`) through one gateway over `engine`."""

    def __init__(self, engine: Any, tokenizer: Any, config: RolloutConfig, *, runner: str = "bwrap") -> None:
        self.config = config
        self.gateway = Gateway(engine, tokenizer, gateway_config(config))
        self.runner = runner
        self.on_episode: EpisodeCallback | None = None
        self._harnesses: dict[int, HarnessEnv] = {}  # by id() of the task (configs are not hashable)
        self._started = False
        self._lock = asyncio.Lock()

    def harness(self, task: TaskConfig) -> HarnessEnv:
        """The task's `HarnessEnv` (made on first use)."""
        if id(task) not in self._harnesses:
            harness = HarnessEnv(
                env_factory(task),
                str(task.harness),
                self.gateway,
                runner=self.runner,
                wall_clock_s=self.config.episode_timeout_s,
                extra_env=task.harness_env,
            )
            harness.env_id = task.env
            self._harnesses[id(task)] = harness
        return self._harnesses[id(task)]

    async def play_group(self, task: TaskConfig, seed: int, group_id: str) -> list[Trajectory] | None:
        """`group_size + redundancy` episodes; the samples of the first `group_size` to finish without an error."""
        async with self._lock:
            if not self._started:
                await self.gateway.start()
                self._started = True
        harness = self.harness(task)
        episodes = [
            self._episode(harness, task, seed, group_id, index)
            for index in range(self.config.group_size + self.config.redundancy)
        ]
        kept = await keep_first_finished(episodes, self.config.group_size, ok=lambda samples: bool(samples))
        return [sample for samples in kept for sample in samples] if kept is not None else None

    async def _episode(
        self, harness: HarnessEnv, task: TaskConfig, seed: int, group_id: str, index: int
    ) -> list[Trajectory]:
        """One episode's samples ([] when it failed); the record sees it once, as `episode_record` makes it. With
        rollout.seeded its calls are seeded as the rollout loop's turns are (task, seed, group, index, call)."""
        started = time.monotonic()
        key = f"{task.env}|{seed}|{group_id}|{index}" if self.config.seeded else None
        try:
            episode = await harness.play(seed, group_id=group_id, sampling_key=key)
        except asyncio.CancelledError:  # a spare cut by its group: recorded, like the rollout loop's
            self._record(failed(task, seed, group_id, "cancelled", {}, time.monotonic() - started))
            raise
        except Exception as exc:  # an env that cannot reset, a sandbox that cannot start: the task's error
            error = {"error": f"{type(exc).__name__}: {exc}"[:2000], "error_stage": "harness"}
            self._record(failed(task, seed, group_id, "error", error, time.monotonic() - started))
            return []
        if episode.samples is None and episode.calls and task.harness_errors == "zero":
            episode = scored_zero(episode, task, seed, group_id)
        self._record(episode_record(episode, task, seed, group_id))
        return list(episode.samples.trajectories) if episode.samples is not None else []

    def _record(self, trajectory: Trajectory) -> None:
        if self.on_episode is not None:
            self.on_episode(trajectory)

    async def close(self) -> None:
        """Stop the gateway (the engine belongs to the trainer)."""
        if self._started:
            await self.gateway.stop()
            self._started = False


def scored_zero(episode: HarnessEpisode, task: TaskConfig, seed: int, group_id: str) -> HarnessEpisode:
    """A failed episode that called the model, as the policy's failure (`harness_errors: zero`): its calls become
    samples of reward 0 under the merge rule; its error stays on it for the record."""
    samples = to_trajectories(
        episode.calls, 0.0, task=task.env, group_id=group_id, seed=seed, env_info={"harness_error": True}
    )
    return dataclasses.replace(episode, reward=0.0, samples=samples)


def calls_log(episode: HarnessEpisode) -> list[dict[str, Any]]:
    """The episode's model calls as its record's log: `kind` "call", then `RecordedCall.as_record()`."""
    return [{"kind": "call", **call.as_record()} for call in episode.calls]


def failed(
    task: TaskConfig, seed: int, group_id: str, finish: str, info: dict[str, Any], duration: float
) -> Trajectory:
    """The record of an episode that gave no samples."""
    return Trajectory(
        input_ids=[],
        loss_mask=[],
        behavior_logprobs=[],
        versions=[],
        reward=0.0,
        task=task.env,
        group_id=group_id,
        seed=seed,
        turns=0,
        finish_reason=finish,  # type: ignore[arg-type]
        env_info={"harness": task.harness, **info},
        duration_s=duration,
    )


def episode_record(episode: HarnessEpisode, task: TaskConfig, seed: int, group_id: str) -> Trajectory:
    """The episode as the run record and the error counts see it: one trajectory holding every sample's tokens
    end to end (so its model tokens and policy versions are what the learner gets), its calls as its log, and in
    `env_info` the harness, `merged`, `samples` and `calls` (or the error with the program's stderr tail)."""
    head = {"harness": task.harness, "calls": len(episode.calls), "exit_code": episode.exit_code}
    if episode.samples is None:
        info = {**head, "error": episode.error, "error_stage": "harness", "stderr_tail": episode.stderr_tail}
        record = failed(task, seed, group_id, "error", info, episode.duration_s)
        record.turn_log = calls_log(episode)
        return record
    samples = episode.samples.trajectories
    first = samples[0]
    info = {k: v for k, v in first.env_info.items() if k != "sample"}
    if episode.error:  # trained with reward 0 (harness_errors: zero): what went wrong is kept
        info.update(harness_error=episode.error, stderr_tail=episode.stderr_tail)
    return Trajectory(
        input_ids=[i for t in samples for i in t.input_ids],
        loss_mask=[m for t in samples for m in t.loss_mask],
        behavior_logprobs=[lp for t in samples for lp in t.behavior_logprobs],
        versions=[v for t in samples for v in t.versions],
        reward=episode.reward,
        task=task.env,
        group_id=group_id,
        seed=seed,
        turns=len(episode.calls),
        finish_reason=first.finish_reason,
        env_info={**info, **head, "merged": episode.merged, "samples": len(samples), "action": episode.action},
        duration_s=episode.duration_s,
        turn_log=calls_log(episode),
        episode=first.episode,
    )
