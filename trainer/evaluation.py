"""The trainer's before/after evaluation: the policy on fixed held-out seeds of every task, in RUN_DIR/eval.json.

It is `envhub eval` itself (`envhub.eval.evaluate`) with an `EngineAgent` over a `EmbeddedEngine` serving the policy,
greedy by default, so an evaluated episode is laid out token for token as a training episode and `envhub eval` on
the exported checkpoint plays the same episodes. Not bit for bit: with every episode in flight at once, which rows share
a bf16 decode batch changes the sums, and a near-tie can flip (docs/trainer.md, learning parity: 3-5 of 48 greedy
episodes differ between repeats). Each label's episodes are in RUN_DIR/eval-LABEL/ (`envhub view` reads
them).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

from envhub.eval import EpisodeRecord, EvalConfig, evaluate
from envhub.trainer.config import TrainConfig


def mean_and_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (0 for fewer than two values)."""
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
    """Rewards of evaluation episodes (seeds evaluation.seed .. +episodes-1) of every task, errors left out."""
    from envhub.agents.engine import EngineAgent
    from envhub.inference import SamplingParams
    from envhub.trainer.engines.embedded import EmbeddedEngine, served_dtype
    from envhub.trainer.models import copy_as
    from envhub.trainer.rollout.tasks import env_factory

    ev, rollout = config.evaluation, config.rollout
    # the policy as the training engine serves it (bf16 where that engine is bf16), on a copy: the learner's fp32
    # masters stay as they are
    dtype = served_dtype(config, model)
    engine = EmbeddedEngine(
        copy_as(model, dtype).eval(),
        tokenizer,
        max_batch_size=max(config.engine.max_batch_size, 1),
        prefix_cache_mb=config.engine.prefix_cache_mb,
        prefill_chunk=config.engine.prefill_chunk,
        dtype=dtype,
        priority=config.engine.priority,
    )
    sampling = SamplingParams(max_new_tokens=rollout.max_new_tokens, temperature=ev.temperature, top_p=1.0)

    def agents() -> EngineAgent:  # one agent per episode, all batched on the same engine
        return EngineAgent(engine, tokenizer, sampling, max_total_tokens=rollout.max_total_tokens)

    eval_config = EvalConfig(
        max_turns=ev.max_turns or rollout.max_turns,
        episode_timeout_s=rollout.episode_timeout_s,
        env_factories={task.env: env_factory(task) for task in config.tasks},
    )
    rewards: dict[str, list[float]] = {task.env: [] for task in config.tasks}

    def keep(record: EpisodeRecord) -> None:
        if not record.error_kind:
            rewards[record.env_id].append(record.reward)

    if record_dir is not None:
        shutil.rmtree(record_dir, ignore_errors=True)
    try:
        await evaluate(
            [task.env for task in config.tasks],
            agents,
            episodes=ev.episodes,
            seeds=ev.seed,
            concurrency=max(1, ev.episodes * len(config.tasks)),
            out_dir=record_dir,
            config=eval_config,
            agent_name="policy",
            on_episode=keep,
        )
    finally:
        await engine.close()
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
        record_dir = self.path.parent / f"eval-{label}"
        self.results[label] = await evaluate_policy(model, tokenizer, self.config, record_dir)
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
                row[label], row[f"{label}_se"] = mean_and_se(self.results[label].get(task, []))
            out[task] = row
        overall: dict[str, Any] = {"episodes": self.config.evaluation.episodes * len(self.config.tasks)}
        for label in labels:
            per_task = [out[t][label] for t in out]
            overall[label] = sum(per_task) / len(per_task) if per_task else 0.0
            overall[f"{label}_se"] = mean_and_se([r for rs in self.results[label].values() for r in rs])[1]
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
