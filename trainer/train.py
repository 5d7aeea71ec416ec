"""The training loop: rollouts feed the queue while the learner steps; weights go to the engine after each step.

Async mode overlaps rollout and learning within `max_staleness` policy versions (enforced by the
queue's admission control). Sync mode is the same code with max_staleness = 0: the groups of step v+1
cannot start before the learner has published version v+1, so nothing overlaps.
"""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
import sys
import time
import traceback
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from envhub.inference import InferenceEngine
from envhub.trainer.config import TaskConfig, TrainConfig, config_to_dict
from envhub.trainer.engines.weights import load_state
from envhub.trainer.evaluation import BeforeAfter
from envhub.trainer.learner.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from envhub.trainer.learner.distributed import run_follower, start_learner_processes
from envhub.trainer.learner.precision import export_weights, resolve_precision
from envhub.trainer.learner.step import Learner
from envhub.trainer.metrics import MetricsLogger
from envhub.trainer.models import build_policy
from envhub.trainer.preflight import preflight
from envhub.trainer.queue import TrajectoryQueue
from envhub.trainer.records import EpisodeRecorder
from envhub.trainer.rollout import EnvFactory, RolloutWorker
from envhub.trainer.sft import warm_start
from envhub.trainer.task_errors import TaskErrors
from envhub.trainer.tasks import TaskSampler, env_factory
from envhub.trainer.trajectory import Trajectory


def off_policy_warning(history: list[dict[str, Any]], mode: str, window: int = 3, max_clip: float = 0.5) -> str | None:
    """A warning when async steps keep training on stale samples most of whose tokens the PPO clip discards.

    With `max_staleness` >= 1 a batch comes from the policy one step (or more) back; when one step moves the
    policy far (a high lr), the ratio to that behaviour policy leaves the clip range for most tokens, their
    gradient is zero, and the run learns far less than the same config in sync mode.
    """
    recent = history[-window:]
    if mode != "async" or len(recent) < window:
        return None
    if all(r.get("staleness", 0) > 0.5 and r.get("learner/clip_fraction", 0) > max_clip for r in recent):
        clip = sum(r["learner/clip_fraction"] for r in recent) / window
        kl = recent[-1].get("learner/kl_behavior", float("nan"))
        return (
            f"warning: the last {window} async steps trained on samples from an older policy and the PPO clip "
            f"discarded {clip:.0%} of their tokens (KL(behaviour || learner) {kl:.3g}): each step moves the policy "
            "too far for off-policy samples to teach. Lower algorithm.lr, or set algorithm.mode: sync or "
            "algorithm.max_staleness: 0."
        )
    return None


class InProcessRollouts:
    """Rollout source of the default single-process setup: a RolloutWorker on the trainer's event loop."""

    def __init__(self, worker: RolloutWorker, factories: dict[str, EnvFactory]) -> None:
        self.worker = worker
        self.factories = factories

    async def run_group(self, task: TaskConfig, seed: int, group_id: str) -> list[Trajectory] | None:
        """One GRPO group of `task` on seed `seed`."""
        return await self.worker.run_group(self.factories[task.env], task.env, seed, group_id)

    async def close(self) -> None:
        """Nothing to release."""


@dataclass
class TrainResult:
    """How a run ended."""

    out_dir: Path
    first_step: int
    last_step: int
    interrupted: bool
    wall_s: float
    checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str = ""


class Trainer:
    """Runs a TrainConfig: engine, rollout worker, queue, learner, metrics and checkpoints."""

    def __init__(
        self,
        config: TrainConfig,
        out_dir: str | Path | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        ray: Any = None,
    ) -> None:
        self.config = config
        self.ray = ray  # RayOptions: play episodes on Ray actors instead of in this process
        self.rollouts: Any = None
        self.out_dir = Path(out_dir or config.out_dir)
        self.on_step = on_step
        self._stop = asyncio.Event()
        self.engine: InferenceEngine | None = None
        self.stop_reason = "step budget spent"
        self.learner_group: Any = None  # DistLearner when the learner runs on several processes
        self.sft_stats: dict[str, float] | None = None  # the warm start's losses, when the config has an sft stage
        self.on_progress: Callable[[dict[str, Any]], None] | None = None  # called about twice a second within a step

    def request_stop(self) -> None:
        """Finish the step in progress, save a checkpoint and return (what Ctrl-C does)."""
        self._stop.set()

    def _make_engine(self, model: Any, tokenizer: Any) -> InferenceEngine:
        cfg = self.config.engine
        if cfg.kind == "local":
            from envhub.trainer.engines.local import LocalEngine

            learner_dtype = resolve_precision(self.config.model.device, self.config.model.dtype).engine_dtype
            bf16_learner = cfg.dtype == "auto" and learner_dtype == torch.bfloat16
            return LocalEngine(
                copy.deepcopy(model).eval(),
                tokenizer,
                max_batch_size=cfg.max_batch_size,
                prefix_cache_mb=cfg.prefix_cache_mb,
                prefill_chunk=cfg.prefill_chunk,
                dtype=torch.bfloat16 if bf16_learner else cfg.dtype,
                kv_cache_mb=cfg.kv_cache_mb,
                cuda_graphs=None if cfg.cuda_graphs else False,
            )
        from envhub.trainer.engines.routing import http_engines

        return http_engines(
            cfg.url, api_key=cfg.api_key or None, pause_mode=cfg.pause_mode
        )  # several URLs: sticky routing

    async def _push_weights(self, learner: Learner, version: int) -> None:
        """Send the learner's weights, cast to the engine dtype: in-process state for LocalEngine, a saved dir for a
        server."""
        assert self.engine is not None
        state = await asyncio.to_thread(learner.engine_state)  # LoRA merged; gathered from every process under FSDP
        if self.config.engine.kind == "local":
            await self.engine.update_weights(state, version=version)
        else:
            path = self.out_dir / "weights" / f"v{version:06d}"
            await asyncio.to_thread(export_weights, learner.hf_model(), path, learner.precision.engine_dtype, state)
            await self.engine.update_weights(str(path), version=version)
            for old in path.parent.glob("v*"):  # the server has loaded this one; older copies are dead weight
                if old != path:
                    await asyncio.to_thread(shutil.rmtree, old, True)

    async def run(self, resume: bool = False) -> TrainResult:
        """Train until the step or time budget is spent, or `request_stop` is called."""
        cfg, algo = self.config, self.config.algorithm
        started = time.monotonic()
        self.learner_group = start_learner_processes(cfg)  # None with one learner process
        if self.learner_group is not None and self.learner_group.rank > 0:  # a torchrun follower: no rollouts here
            await asyncio.to_thread(run_follower, cfg, self.learner_group)
            return TrainResult(
                self.out_dir, 0, 0, False, time.monotonic() - started, None, stop_reason="learner follower"
            )
        try:
            await preflight(cfg.tasks, reset=self.ray is None)  # a bad env id or kwarg stops here, in seconds
        except BaseException:
            if self.learner_group is not None:
                self.learner_group.shutdown()
            raise
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.json").write_text(json.dumps(config_to_dict(cfg), indent=2))
        errors = TaskErrors(cfg.rollout.max_task_errors, self.out_dir / "episode_errors.jsonl")
        factories = {t.env: errors.wrap(t.env, env_factory(t)) for t in cfg.tasks}
        model, tokenizer = build_policy(cfg.model, cfg.seed)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        evaluation = (
            BeforeAfter(cfg, self.out_dir)
            if cfg.evaluation.episodes and not (resume and latest_checkpoint(self.out_dir))
            else None
        )
        if evaluation is not None:
            await evaluation.measure("before", model, tokenizer)
        if (cfg.sft.data or cfg.sft.collect) and not (resume and latest_checkpoint(self.out_dir)):
            self.sft_stats = await warm_start(model, tokenizer, cfg, pad_id, self.out_dir)
            if evaluation is not None and cfg.evaluation.after_sft:
                await evaluation.measure("sft", model, tokenizer)
        # the final policy is evaluated on a plain copy (the learner's model may be wrapped by LoRA or sharded by FSDP)
        eval_model = copy.deepcopy(model) if evaluation is not None else None
        final_state: dict[str, Any] | None = None
        self.engine = self._make_engine(model, tokenizer)  # before LoRA wraps the model: engines serve plain weights
        learner = Learner.from_config(cfg, model, tokenizer, self.learner_group)
        staleness = algo.max_staleness if algo.mode == "async" else 0
        queue = TrajectoryQueue(
            algo.groups_per_step,
            staleness,
            algo.stale,
            algo.filter_zero_variance,
            algo.zero_variance_tol,
            algo.max_reward,
        )
        sampler = TaskSampler(cfg.tasks, cfg.seed)
        step = 0
        if resume and (ckpt := latest_checkpoint(self.out_dir)) is not None:
            if learner.sharded:  # FSDP: rank 0 reads the full checkpoint, every process keeps its shards
                learner.load_sharded_checkpoint(ckpt.path)
            else:
                load_checkpoint(ckpt, learner.model, learner.optimizer)
            learner.load_extra_state(ckpt.state.get("learner", {}))
            learner.broadcast_state()  # other learner processes take rank 0's loaded state
            step = ckpt.step
            queue.load_state(ckpt.state["queue"])
            sampler.load_state(ckpt.state["sampler"])
        first_step = step
        if step:
            await self._push_weights(learner, queue.version)
        if self.ray is None:
            self.rollouts = InProcessRollouts(RolloutWorker(self.engine, tokenizer, cfg.rollout), factories)
        else:
            from envhub.trainer.ray_workers import RayRolloutSource

            self.rollouts = await RayRolloutSource.start(self.ray, cfg, self.engine)
        rollouts = self.rollouts
        metrics = MetricsLogger(self.out_dir)
        recorder = EpisodeRecorder(self.out_dir)
        recorder.attach(rollouts, lambda: queue.version)
        queue.on_dropped = lambda g: recorder.group(g[0].group_id, g[0].task, "dropped_stale", queue.version)
        # rewards of recently finished episodes per task, filtered groups included (they count for the curve)
        window = 2 * algo.groups_per_step * cfg.rollout.group_size
        finished: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        all_finished: deque[float] = deque(maxlen=window)
        groups_in_flight: set[asyncio.Task] = set()
        counter = 0

        async def run_group(task: TaskConfig, seed: int, group_id: str) -> None:
            try:
                group = await rollouts.run_group(task, seed, group_id)
            except Exception:  # a crashed group must still give back its admission slot, or the loop can hang
                traceback.print_exc()
                group = None
            for traj in group or []:
                finished[traj.task].append(traj.reward)
                all_finished.append(traj.reward)
            outcome = await queue.put(group)
            if outcome != "accepted":
                recorder.group(group_id, task.env, outcome, queue.version, group or ())

        async def produce() -> None:
            nonlocal counter
            limit = asyncio.Semaphore(max(cfg.rollout.concurrent_groups, algo.groups_per_step))
            while True:
                await limit.acquire()
                await queue.admit()
                task, seed = sampler.sample()
                counter += 1
                t = asyncio.create_task(run_group(task, seed, f"{step}-{counter}"))
                groups_in_flight.add(t)
                t.add_done_callback(lambda done: (groups_in_flight.discard(done), limit.release()))

        producer = asyncio.create_task(produce())
        history: list[dict[str, Any]] = []
        warned_off_policy = False
        ended_cleanly = False
        saved: Path | None = None
        interrupted = False
        try:
            while step < cfg.budget.steps:
                errors.raise_if_failing()  # also when other tasks keep the batches coming
                if cfg.budget.max_time_s and time.monotonic() - started > cfg.budget.max_time_s:
                    self.stop_reason = "time budget spent"
                    break
                batch_task = asyncio.ensure_future(queue.get_batch())
                stop_task = asyncio.ensure_future(self._stop.wait())
                while not batch_task.done() and not stop_task.done() and not producer.done():
                    await asyncio.wait(
                        {batch_task, stop_task, producer}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED
                    )
                    if self.on_progress is not None:
                        self.on_progress(self._progress(recorder, queue, len(groups_in_flight)))
                    errors.raise_if_failing()
                    if (reason := queue.stop_reason(algo.max_filtered_in_a_row)) is not None:
                        self.stop_reason = reason
                        break
                    if cfg.budget.max_time_s and time.monotonic() - started > cfg.budget.max_time_s:
                        self.stop_reason = "time budget spent"
                        break
                stop_task.cancel()
                if producer.done():
                    producer.result()  # surface a crashed producer
                if not batch_task.done():
                    batch_task.cancel()
                    interrupted = self._stop.is_set()
                    break
                groups, corrected = batch_task.result()
                staleness = [queue.staleness(g) for g in groups]
                step_started = time.monotonic()
                stats = await asyncio.to_thread(
                    learner.step, groups, min_version=queue.min_version()
                )  # stale tokens: per token
                step += 1
                for g in groups:
                    recorder.group(g[0].group_id, g[0].task, "trained", step, g)
                await self._push_weights(learner, step)
                await queue.set_version(step)
                row = self._row(
                    step,
                    groups,
                    staleness,
                    stats,
                    finished,
                    all_finished,
                    queue,
                    started,
                    time.monotonic() - step_started,
                )
                row.update(errors.metrics())
                row["tasks"] = recorder.task_metrics()
                metrics.log(step, row)
                history.append(row)
                if not warned_off_policy and (warning := off_policy_warning(history, algo.mode)):
                    warned_off_policy = True
                    print(warning, file=sys.stderr, flush=True)
                if self.on_step is not None:
                    self.on_step(row)
                if step % cfg.budget.checkpoint_every == 0 or step == cfg.budget.steps:
                    saved = await self._save(step, tokenizer, learner, queue, sampler)
                if self._stop.is_set():
                    interrupted = True
                    break
            if interrupted:
                self.stop_reason = "interrupted"
            ended_cleanly = True
        finally:
            producer.cancel()
            for t in list(groups_in_flight):
                t.cancel()
            await asyncio.gather(producer, *groups_in_flight, return_exceptions=True)
            await rollouts.close()
            await self.engine.close()
            if step > first_step and (saved is None or not saved.name.endswith(f"{step:06d}")):
                saved = await self._save(step, tokenizer, learner, queue, sampler)
            recorder.close(step)
            if step > first_step:  # no step, no curve (and no file named that was never written)
                metrics.plot_rewards()
            metrics.close()
            # gathered before the learner processes go; not after a crash, where a collective could wait forever
            # on a dead process and the evaluation would not run anyway
            if eval_model is not None and not interrupted and ended_cleanly:
                final_state = await asyncio.to_thread(learner.engine_state, torch.float32)
            if self.learner_group is not None:
                self.learner_group.shutdown()
        if eval_model is not None and final_state is not None:
            load_state(eval_model, final_state)
            await evaluation.measure("after", eval_model, tokenizer)
            print(evaluation.table(), flush=True)
        return TrainResult(
            self.out_dir, first_step, step, interrupted, time.monotonic() - started, saved, history, self.stop_reason
        )

    def _progress(self, recorder: EpisodeRecorder, queue: TrajectoryQueue, groups_running: int) -> dict[str, Any]:
        """What is happening within the current learner step (for progress bars)."""
        worker = getattr(self.rollouts, "worker", None)
        engine_tokens = getattr(getattr(self.engine, "stats", None), "tokens", None)
        elapsed = max(time.monotonic() - recorder.started, 1e-9)
        return {
            "episodes_running": getattr(worker, "episodes_running", None),
            "episodes_done": recorder.episodes_done,
            "groups_running": groups_running,
            "groups_accepted": queue.counters.accepted,
            "groups_filtered": queue.counters.filtered_zero_variance,
            "groups_dropped": queue.counters.dropped_stale,
            "tokens_per_s": engine_tokens / elapsed if engine_tokens is not None else recorder.tokens_per_s(),
        }

    async def _save(
        self, step: int, tokenizer: Any, learner: Learner, queue: TrajectoryQueue, sampler: TaskSampler
    ) -> Path:
        """Snapshot the learner (a collective under FSDP), then write the files off the event loop."""
        snapshot = await asyncio.to_thread(learner.checkpoint_state)
        state = {
            "queue": queue.state(),
            "sampler": sampler.state(),
            "version": queue.version,
            "learner": snapshot.extra,
        }
        budget = self.config.budget
        return await asyncio.to_thread(
            save_checkpoint,
            self.out_dir,
            step,
            learner.model if snapshot.adapter_only else learner.hf_model(),
            tokenizer,
            snapshot.optimizer,
            state,
            model_state=snapshot.model,
            max_shard_size=budget.checkpoint_max_shard_size,
            keep=budget.checkpoint_keep,
        )

    def _row(
        self,
        step: int,
        groups: list[list[Trajectory]],
        staleness: list[int],
        stats: dict[str, float],
        finished: dict[str, deque[float]],
        all_finished: deque[float],
        queue: TrajectoryQueue,
        started: float,
        step_s: float,
    ) -> dict[str, Any]:
        trajs = [t for g in groups for t in g]
        return {
            "reward": {
                "all": sum(all_finished) / len(all_finished),
                **{task: sum(rs) / len(rs) for task, rs in finished.items() if rs},
            },
            "batch_reward": sum(t.reward for t in trajs) / len(trajs),
            "model_tokens": sum(t.num_model_tokens for t in trajs),
            "turns": sum(t.turns for t in trajs) / len(trajs),
            "staleness": sum(staleness) / len(staleness),
            "queue": queue.counters.as_dict(),
            "learner": stats,
            "step_s": step_s,
            "elapsed_s": time.monotonic() - started,
        }
