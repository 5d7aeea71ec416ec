"""The training loop, in four phases: prepare, produce, train step, finish.

Rollouts feed the queue while the learner steps; weights go to the engine after each step. Async mode overlaps
rollout and learning within `max_staleness` policy versions (the queue's admission, `envhub.trainer.staleness`).
Sync mode is the same code with max_staleness = 0: the groups of step v+1 cannot start before the learner has
published version v+1, so nothing overlaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from envhub.errors import ConfigError
from envhub.inference import InferenceEngine
from envhub.trainer.config import TrainConfig, config_to_dict
from envhub.trainer.engines import MultiEngine, WatchedEngine, engine_kind
from envhub.trainer.engines.embedded import releasing_openmp, served_dtype
from envhub.trainer.engines.weights import load_state
from envhub.trainer.evaluation import BeforeAfter
from envhub.trainer.learner.checkpoint import (
    CheckpointError,
    latest_checkpoint,
)
from envhub.trainer.learner.credit import credit_signal
from envhub.trainer.learner.distributed import run_follower, start_learner_processes
from envhub.trainer.learner.step import Learner
from envhub.trainer.models import build_policy, copy_as
from envhub.trainer.rollout.preflight import preflight
from envhub.trainer.rollout.producer import GroupProducer
from envhub.trainer.rollout.queue import TrajectoryQueue
from envhub.trainer.rollout.sources import LocalRollouts, MixedRollouts, RolloutSource
from envhub.trainer.rollout.tasks import TaskSampler, env_factory
from envhub.trainer.rollout.worker import RolloutWorker
from envhub.trainer.run.cores import CoreShare
from envhub.trainer.run.cpu_usage import cpu_times, cpu_used
from envhub.trainer.run.errors import TaskErrors
from envhub.trainer.run.metrics import MetricsLogger, off_policy_warning
from envhub.trainer.run.record import EpisodeRecorder
from envhub.trainer.run.resume import (
    ERRORS_FILE,
    restore_checkpoint,
    restore_record,
    rewind_record,
    save_run,
    stop_error,
)
from envhub.trainer.run.run_dir import claim_run_dir
from envhub.trainer.run.stages import StageClock, StepTimer
from envhub.trainer.sft import warm_start
from envhub.trainer.staleness import Staleness
from envhub.trainer.trajectory import Group, episodes_of
from envhub.user_modules import load_user_modules


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


@dataclass
class _Run:
    """What one `Trainer.run` holds while it trains."""

    started: float
    tokenizer: Any
    learner: Learner
    queue: TrajectoryQueue
    sampler: TaskSampler
    errors: TaskErrors
    recorder: EpisodeRecorder
    metrics: MetricsLogger
    producer: GroupProducer
    timer: StepTimer
    evaluation: BeforeAfter | None = None
    eval_model: Any = None  # a plain copy for the final evaluation (the learner's may be LoRA-wrapped or sharded)
    step: int = 0
    first_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    saved: Path | None = None
    interrupted: bool = False
    ended_cleanly: bool = False
    warned_off_policy: bool = False
    final_state: dict[str, torch.Tensor] | None = None
    save_attempted: int = -1  # the step of the last save begun (a failed one is not tried again on the way out)
    save_error: CheckpointError | None = None  # the last save, on the way out, could not be written
    cpu_start: tuple[float, float, float] = field(default_factory=cpu_times)  # rows count CPU from here on


class Trainer:
    """Runs a TrainConfig: engine, rollout source, queue, learner, metrics and checkpoints."""

    def __init__(
        self,
        config: TrainConfig,
        out_dir: str | Path | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        ray: Any = None,
    ) -> None:
        self.config = config
        self.ray = ray  # RayOptions: play episodes on Ray actors instead of in this process
        self.rollouts: RolloutSource | None = None
        self.out_dir = Path(out_dir or config.out_dir)
        self.on_step = on_step
        self._stop = asyncio.Event()
        self.engine: InferenceEngine | None = None
        self.kind: Any = None  # the engine's EngineKind, named once the config's imports: are loaded (_prepare)
        self.stop_reason = "step budget spent"
        self.learner_group: Any = None  # DistLearner when the learner runs on several processes
        self.sft_stats: dict[str, float] | None = None  # the warm start's losses, when the config has an sft stage
        self.on_progress: Callable[[dict[str, Any]], None] | None = None  # called about twice a second within a step
        self.clock = StageClock(self.out_dir)  # where the run's time went: RUN_DIR/stages.json, `summary()`
        self.cores: CoreShare | None = None  # the threads rule, from the config (_prepare)

    def request_stop(self) -> None:
        """Finish the step in progress, save a checkpoint and return (what Ctrl-C does)."""
        self._stop.set()

    async def run(self, resume: bool = False, overwrite: bool = False) -> TrainResult:
        """Train until the step or time budget is spent, or `request_stop` is called.

        A directory that holds another run is refused unless `resume` (continue it) or `overwrite` (delete what
        the trainer wrote there): trainer/run/run_dir.py."""
        started = time.monotonic()
        self.learner_group = start_learner_processes(self.config)  # None with one learner process
        if self.learner_group is not None and self.learner_group.rank > 0:  # a torchrun follower: no rollouts here
            await asyncio.to_thread(run_follower, self.config, self.learner_group)
            return TrainResult(self.out_dir, 0, 0, False, time.monotonic() - started, None, stop_reason="follower")
        try:
            claim_run_dir(self.out_dir, resume=resume, overwrite=overwrite)
        except BaseException:
            await self._abandon()
            raise
        try:
            run = await self._prepare(resume, started)
        except BaseException as failure:
            await self._abandon()
            if (stopped := stop_error(failure, self.out_dir, None)) is failure:
                raise
            raise stopped from failure
        self.clock.start_rl()  # RL's time budget counts from here: after the evaluations, SFT and the engine's start
        producing = asyncio.create_task(run.producer.run())
        try:
            await self._train_until_stopped(run, producing)
        except BaseException as failure:
            await self._finish(run, producing)
            if (stopped := stop_error(failure, self.out_dir, run.step)) is failure:
                raise
            raise stopped from failure
        await self._finish(run, producing)
        self.clock.end_rl(run.step - run.first_step, run.history)
        if run.save_error is not None:  # the last checkpoint could not be written: the previous one is intact
            raise run.save_error
        await self._evaluate_after(run)
        wall_s = time.monotonic() - started
        return TrainResult(
            self.out_dir, run.first_step, run.step, run.interrupted, wall_s, run.saved, run.history, self.stop_reason
        )

    async def _train_until_stopped(self, run: _Run, producing: asyncio.Task[None]) -> None:
        """Steps until a budget is spent, a stop is requested or the queue says why training cannot go on."""
        while run.step < self.config.budget.steps and not run.interrupted:
            batch = await self._next_batch(run, producing)
            if batch is None:
                break
            await self._train_step(run, batch, producing)
            run.interrupted = self._stop.is_set()
        if run.interrupted:
            self.stop_reason = "interrupted"
        run.ended_cleanly = True

    # -- prepare ------------------------------------------------------------------------------------------------
    async def _prepare(self, resume: bool, started: float) -> _Run:
        """Check the tasks, build policy, engine, learner, queue and rollout source; resume or warm-start."""
        cfg = self.config
        load_user_modules(cfg.imports, option="imports:")  # the config's own env modules (envhub train --import)
        self.kind = engine_kind(cfg.engine.kind)  # a kind from the config's imports: is known from here
        self.kind.check(cfg)
        self.cores = CoreShare.from_config(cfg)
        print(self.cores.describe(), flush=True)
        await preflight(cfg.tasks, reset=self.ray is None)  # a bad env id or kwarg stops here, in seconds
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.json").write_text(json.dumps(config_to_dict(cfg), indent=2))
        saved = latest_checkpoint(self.out_dir) if resume else None
        resuming = saved is not None
        model, tokenizer = build_policy(cfg.model, cfg.seed)
        evaluation, eval_model = await self._warm_start(model, tokenizer, resuming)
        with self.clock.stage("engine start"):  # before LoRA wraps the model: engines serve plain weights
            built = await self.kind.build(cfg, model, tokenizer)
            if callable(describe := getattr(built, "describe", None)):  # the embedded engine's kernels
                print(describe(), flush=True)
            self.engine = self.kind.watch(built, cfg)
        self.cores.attach(self.engine)
        learner = Learner.from_config(cfg, model, tokenizer, self.learner_group)
        algo = cfg.algorithm
        queue = TrajectoryQueue(
            algo.groups_per_step,
            Staleness.from_config(algo),
            algo.filter_zero_variance,
            algo.zero_variance_tol,
            algo.max_reward,
            credit_signal(algo),
        )
        sampler = TaskSampler(cfg.tasks, cfg.seed, by_signal=cfg.rollout.task_sampling == "signal")
        step = restore_checkpoint(saved, learner, queue, sampler) if saved is not None else 0
        if step:
            await self.kind.push(self.engine, learner, queue.version, cfg, self.out_dir)
        self.rollouts = await self._rollout_source(tokenizer)
        if resume:  # rows a killed process wrote past the checkpoint go: each step is recorded once
            rewind_record(self.out_dir, saved.state.get("record") if saved is not None else None)
        errors = TaskErrors(cfg.rollout.max_task_errors, self.out_dir / ERRORS_FILE)
        recorder = EpisodeRecorder(self.out_dir)
        producer = GroupProducer(
            self.rollouts,
            queue,
            sampler,
            recorder,
            errors,
            concurrency=max(cfg.rollout.concurrent_groups, algo.groups_per_step + algo.spare_groups),
            reward_window=2 * algo.groups_per_step * cfg.rollout.group_size,
        )
        if saved is not None and "record" in saved.state:
            restore_record(saved.state["record"], recorder, errors, producer, step)
        metrics = MetricsLogger(self.out_dir, purge_step=step + 1 if resume else None)
        timer = StepTimer(self.engine)
        run = _Run(started, tokenizer, learner, queue, sampler, errors, recorder, metrics, producer, timer)
        run.evaluation, run.eval_model, run.step, run.first_step = evaluation, eval_model, step, step
        return run

    async def _abandon(self) -> None:
        """Release what a failed preparation had started: rollout workers, the engine, learner processes."""
        if self.rollouts is not None:
            await self.rollouts.close()
        if self.engine is not None:
            await self.engine.close()
        if self.learner_group is not None:
            self.learner_group.shutdown()

    async def _warm_start(self, model: Any, tokenizer: Any, resuming: bool) -> tuple[BeforeAfter | None, Any]:
        """Evaluate before training and run the SFT stage (new runs only); returns the evaluation and its model copy."""
        cfg = self.config
        evaluation = BeforeAfter(cfg, self.out_dir) if cfg.evaluation.episodes and not resuming else None
        if evaluation is not None and cfg.evaluation.before:
            with self.clock.stage("evaluation before"):
                await evaluation.measure("before", model, tokenizer)
        if (cfg.sft.data or cfg.sft.collect) and not resuming:
            with self.clock.stage("sft"):
                self.sft_stats = await warm_start(model, tokenizer, cfg, self.out_dir, self.cores)
            if evaluation is not None and cfg.evaluation.after_sft:
                with self.clock.stage("evaluation sft"):
                    await evaluation.measure("sft", model, tokenizer)
        if evaluation is None:
            return None, None
        # kept for the final evaluation, in the dtype it is decoded in: half the memory of an fp32 copy
        return evaluation, copy_as(model, served_dtype(cfg, model))

    async def _rollout_source(self, tokenizer: Any) -> RolloutSource:
        """Episodes played on this process's event loop, or on Ray actors when the run asks for them."""
        cfg = self.config
        assert self.engine is not None
        harness_tasks = [task for task in cfg.tasks if task.harness is not None]
        if self.ray is not None:
            from envhub.trainer.rollout.ray_workers import RayRolloutSource

            if harness_tasks:
                raise ConfigError(
                    f"task {harness_tasks[0].env} has a harness, and harness episodes play on this process",
                    hint="train harness tasks without --ray",
                )
            return await RayRolloutSource.start(self.ray, cfg, self.engine)
        factories = {task.env: env_factory(task) for task in cfg.tasks if task.harness is None}
        plain = LocalRollouts(RolloutWorker(self.engine, tokenizer, cfg.rollout), factories)
        if not harness_tasks:
            return plain
        from envhub.trainer.rollout.harness_rollouts import HarnessRollouts

        return MixedRollouts(plain, HarnessRollouts(self.engine, tokenizer, cfg.rollout))

    # -- produce: wait for a batch while rollouts run -------------------------------------------------------------
    async def _next_batch(self, run: _Run, producing: asyncio.Task[None]) -> list[Group] | None:
        """The next batch of groups, or None when the run must stop first (stop_reason says why)."""
        self._raise_if_failing(run)  # also when other tasks keep the batches coming
        if self._stop.is_set():  # Ctrl-C during SFT or an evaluation: an interrupt (exit 130, no final evaluation)
            run.interrupted = True
            return None
        if self._out_of_time(run):
            return None
        run.timer.waiting()
        batch = asyncio.ensure_future(run.queue.get_batch())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            while not batch.done() and not stop.done() and not producing.done():
                await asyncio.wait({batch, stop, producing}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                if self.on_progress is not None:
                    self.on_progress(run.producer.progress(self.engine))
                self._raise_if_failing(run)
                if (reason := run.queue.stop_reason(self.config.algorithm.max_filtered_in_a_row)) is not None:
                    self.stop_reason = reason
                    break
                if self._out_of_time(run):
                    break
        finally:
            stop.cancel()
        if producing.done():
            producing.result()  # surface a crashed producer
        if not batch.done():
            batch.cancel()
            run.interrupted = self._stop.is_set()
            return None
        run.timer.got_batch()
        return batch.result()

    def _raise_if_failing(self, run: _Run) -> None:
        """Stop on a task failing again and again, a record file that cannot be written, or an engine gone for good."""
        run.errors.raise_if_failing()
        run.recorder.raise_if_failed()
        if self.engine is not None:
            self.engine.raise_if_failed()  # a managed server that exited, or an outage past max_outage_s

    def _out_of_time(self, run: _Run) -> bool:
        """max_time_s: RL's own time; max_run_s: the whole run's, the final evaluation included (RL stops early
        enough to leave it the time the run's latest evaluation took, with a margin)."""
        budget, now = self.config.budget, time.monotonic()
        rl_started = self.clock.rl_started or now
        reserve = self.clock.final_evaluation_reserve() if run.evaluation is not None else 0.0
        if (budget.max_time_s and now - rl_started > budget.max_time_s) or (
            budget.max_run_s and now - run.started + reserve > budget.max_run_s
        ):
            self.stop_reason = "time budget spent"
            return True
        return False

    # -- train step ---------------------------------------------------------------------------------------------
    async def _train_step(self, run: _Run, groups: list[Group], producing: asyncio.Task[None]) -> None:
        """One learner step on `groups`, the new weights to the engine, metrics, and a checkpoint when due."""
        assert self.engine is not None
        lags = [run.queue.lag(g) for g in groups]
        step_started = time.monotonic()
        step = self.cores.learner_step(run.learner.step, generating=lambda: bool(run.producer.in_flight))
        stats = await asyncio.to_thread(step, groups, run.queue.version)
        learner_s = time.monotonic() - step_started
        run.step += 1
        if run.step >= self.config.budget.steps:
            # the last step: stop starting groups before its version admits more, or a whole batch that no step
            # will train plays during the final checkpoint (and lands in the record as unfinished)
            producing.cancel()
            await asyncio.gather(producing, return_exceptions=True)
        run.producer.trained(groups, run.step)
        push_started = time.monotonic()
        try:
            push = await self.kind.push(self.engine, run.learner, run.step, self.config, self.out_dir)
        except BaseException:
            run.queue.version = run.step  # the step was taken: its checkpoint says so (nothing more is admitted)
            raise
        await run.queue.set_version(run.step)
        push_s = time.monotonic() - push_started
        row = self._row(run, groups, lags, stats, time.monotonic() - step_started) | push
        row |= run.timer.row(learner_s, push_s, [t for g in groups for t in g])
        run.metrics.log(run.step, row)
        run.history.append(row)
        algo = self.config.algorithm
        if not run.warned_off_policy and (warning := off_policy_warning(run.history, algo.mode)):
            run.warned_off_policy = True
            print(warning, file=sys.stderr, flush=True)
        if self.on_step is not None:
            self.on_step({**row, "step": run.step})
        budget = self.config.budget
        if run.step % budget.checkpoint_every == 0 or run.step == budget.steps:
            run.saved = await self._save(run)

    def _row(self, run: _Run, groups: list[Group], lags: list[int], stats: dict[str, float], step_s: float) -> dict:
        """The step's metrics row."""
        trajs = [t for g in groups for t in g]
        episodes = [e for g in groups for e in episodes_of(g)]  # a split harness episode's samples count once
        harness = [e for e in episodes if "merged" in e[0].env_info]
        merged = {"merged_share": sum(e[0].env_info["merged"] for e in harness) / len(harness)} if harness else {}
        return {
            "reward": run.producer.rewards.means(),
            "batch_reward": sum(e[0].reward for e in episodes) / len(episodes),
            "model_tokens": sum(t.num_model_tokens for t in trajs),
            "turns": sum(t.turns for t in trajs) / len(episodes),
            **merged,  # of the batch's harness episodes: how many were one trajectory
            "staleness": sum(lags) / len(lags),
            "queue": run.queue.counters.as_dict(),
            "learner": stats,
            "step_s": step_s,
            "elapsed_s": time.monotonic() - run.started,
            "time": time.time(),  # wall clock, as in episodes.jsonl: time - elapsed_s is when the run started
            **cpu_used(run.cpu_start, cpu_times()),  # since the run was prepared: the trainer's and the machine's
            **run.errors.metrics(),
            **(self.engine.metrics() if isinstance(self.engine, (WatchedEngine, MultiEngine)) else {}),
            "tasks": run.recorder.task_metrics(),
        }

    async def _save(self, run: _Run) -> Path:
        """Snapshot the learner (a collective under FSDP), then write the files off the event loop."""
        snapshot = await asyncio.to_thread(releasing_openmp(run.learner.checkpoint_state))
        run.save_attempted = run.step
        args = (run.step, run.learner, run.tokenizer, snapshot, run.producer, run.errors, self.config.budget)
        return await asyncio.to_thread(save_run, self.out_dir, *args)

    # -- finish -------------------------------------------------------------------------------------------------
    async def _finish(self, run: _Run, producing: asyncio.Task[None]) -> None:
        """Stop rollouts, close the engine, save the last step, close the record; on a clean end, keep the weights
        the final evaluation needs (gathered before the learner processes go; not after a crash, where a collective
        could wait forever on a dead process)."""
        producing.cancel()
        await asyncio.gather(producing, return_exceptions=True)
        await run.producer.cancel_in_flight()
        if self.rollouts is not None:
            await self.rollouts.close()
        if self.engine is not None:
            await self.engine.close()
        if run.step > run.first_step and run.save_attempted != run.step:  # not again after a save that failed
            try:
                run.saved = await self._save(run)
            except CheckpointError as exc:  # reported after the rest is closed; the previous checkpoint is intact
                run.save_error = exc
        run.producer.close_record(run.step)
        if run.step > run.first_step:  # no step, no curve (and no file named that was never written)
            with contextlib.suppress(OSError):  # a full disk was reported by the write that met it
                run.metrics.plot_rewards()
        run.metrics.close()
        if run.eval_model is not None and not run.interrupted and run.ended_cleanly:
            dtype = next(run.eval_model.parameters()).dtype
            run.final_state = await asyncio.to_thread(releasing_openmp(run.learner.engine_state), dtype)
        if self.learner_group is not None:
            self.learner_group.shutdown()

    async def _evaluate_after(self, run: _Run) -> None:
        """The final policy on the held-out seeds, and the before/after table."""
        if run.evaluation is None or run.final_state is None:
            return
        if run.step == run.first_step and run.evaluation.results:  # the weights the last evaluation measured
            last = list(run.evaluation.results)[-1]
            print(f"no RL step was trained: the final evaluation would measure the weights of '{last}' again; skipped")
        else:
            load_state(run.eval_model, run.final_state)
            with self.clock.stage("evaluation after"):
                await run.evaluation.measure("after", run.eval_model, run.tokenizer)
        print(run.evaluation.table(), flush=True)
