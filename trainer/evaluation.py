"""Greedy evaluation of a policy on fixed held-out seeds per task, before and after training (RUN_DIR/eval.json).

The same rollout code as training plays the episodes (RolloutWorker, temperature 0) on a LocalEngine over the
policy being evaluated, so an evaluated episode is a training episode without sampling noise.

MERGE NOTE (lead): when `envhub.agents.EngineAgent` / `envhub eval` land, this can call them instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

from envhub.trainer.config import TrainConfig


def _mean_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


async def evaluate_policy(
    model: Any, tokenizer: Any, config: TrainConfig, record_dir: Path | None = None
) -> dict[str, list[float]]:
    """Rewards of greedy (or evaluation.temperature) episodes on seeds evaluation.seed .. +episodes-1 of every task."""
    from envhub.trainer.engines.local import LocalEngine
    from envhub.trainer.rollout import RolloutWorker
    from envhub.trainer.tasks import env_factory

    ev = config.evaluation
    rollout = dataclasses.replace(config.rollout, temperature=ev.temperature, top_p=1.0)
    engine = LocalEngine(
        model,
        tokenizer,
        max_batch_size=max(config.engine.max_batch_size, 1),
        prefix_cache_mb=config.engine.prefix_cache_mb,
        prefill_chunk=config.engine.prefill_chunk,
    )
    worker = RolloutWorker(engine, tokenizer, rollout)
    recorder = None
    if record_dir is not None:  # the evaluated episodes, turn by turn (`envhub view RUN_DIR/eval-LABEL`)
        from envhub.trainer.records import EpisodeRecorder

        shutil.rmtree(record_dir, ignore_errors=True)
        recorder = EpisodeRecorder(record_dir)
        worker.on_episode = lambda trajectory: recorder.episode(trajectory, 0)
    jobs = [(task, ev.seed + i) for task in config.tasks for i in range(ev.episodes)]
    try:
        trajectories = await asyncio.gather(
            *[worker.run_episode(env_factory(task), task.env, seed, "eval") for task, seed in jobs]
        )
    finally:
        await engine.close()
        if recorder is not None:
            recorder.close(0)
    rewards: dict[str, list[float]] = {task.env: [] for task in config.tasks}
    for trajectory in trajectories:
        rewards[trajectory.task].append(trajectory.reward)
    return rewards


class BeforeAfter:
    """Collects evaluations under labels (before, sft, after) and writes eval.json plus a printed table."""

    def __init__(self, config: TrainConfig, out_dir: str | Path) -> None:
        self.config = config
        self.path = Path(out_dir) / "eval.json"
        self.results: dict[str, dict[str, list[float]]] = {}

    async def measure(self, label: str, model: Any, tokenizer: Any) -> None:
        """Evaluate `model` now and keep its rewards under `label`; eval.json is rewritten each time."""
        was_training = model.training
        model.eval()
        started = time.monotonic()
        self.results[label] = await evaluate_policy(model, tokenizer, self.config, self.path.parent / f"eval-{label}")
        model.train(was_training)
        self.write()
        means = ", ".join(f"{task} {sum(r) / len(r):.3f}" for task, r in self.results[label].items() if r)
        print(f"eval {label}: {means} ({time.monotonic() - started:.0f}s)", flush=True)

    def report(self) -> dict[str, Any]:
        """{task: {label: mean, label_se: standard error, "episodes": n}, "overall": {...}}."""
        out: dict[str, Any] = {}
        labels = list(self.results)
        for task in (t.env for t in self.config.tasks):
            row: dict[str, Any] = {"episodes": self.config.evaluation.episodes}
            for label in labels:
                row[label], row[f"{label}_se"] = _mean_se(self.results[label].get(task, []))
            out[task] = row
        overall: dict[str, Any] = {"episodes": self.config.evaluation.episodes * len(self.config.tasks)}
        for label in labels:
            per_task = [out[t][label] for t in out]
            overall[label] = sum(per_task) / len(per_task) if per_task else 0.0
            overall[f"{label}_se"] = _mean_se([r for rs in self.results[label].values() for r in rs])[1]
        out["overall"] = overall
        return out

    def write(self) -> None:
        """Write eval.json (atomically)."""
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.report(), indent=2))
        tmp.replace(self.path)

    def table(self) -> str:
        """The report as an aligned text table (mean ± standard error per label)."""
        report, labels = self.report(), list(self.results)
        header = ["task", *labels, "episodes"]
        rows = [
            [task, *(f"{r[label]:.3f} ± {r[label + '_se']:.3f}" for label in labels), str(r["episodes"])]
            for task, r in report.items()
        ]
        widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header, *rows])
