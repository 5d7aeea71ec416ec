"""The trainer's before/after evaluation: the policy on fixed held-out seeds of every task, in RUN_DIR/eval.json.

It is `envhub eval` itself (`envhub.eval.evaluate`) with an `EngineAgent` over a `EmbeddedEngine` serving the policy,
greedy by default, so an evaluated episode is laid out token for token as a training episode and `envhub eval` on
the exported checkpoint plays the same episodes. Not bit for bit: with up to a batch of episodes in flight at once,
which rows share a bf16 decode batch changes the sums, and a near-tie can flip (docs/trainer.md, learning parity: 3-5
of 48 greedy episodes differ between repeats). Each label's episodes are in RUN_DIR/eval-LABEL/ (`envhub view` reads
them); episodes that end in an error (a timeout) are left out of the means and counted in eval.json.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
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


@dataclass
class PolicyEval:
    """One evaluation: each task's rewards of the episodes that ended cleanly, and the episodes left out by error."""

    rewards: dict[str, list[float]]
    errors: dict[str, Counter[str]] = field(default_factory=dict)  #: task -> error kind -> episodes

    def means(self) -> dict[str, float]:
        """Mean reward per task with at least one scored episode."""
        return {task: sum(r) / len(r) for task, r in self.rewards.items() if r}

    def overall(self) -> float:
        """The mean over tasks of each task's mean reward, a task with no scored episode counting 0.0 (eval.json's
        "overall", which `BeforeAfter.report` takes from here); 0.0 without tasks."""
        means = [mean_and_se(r)[0] for r in self.rewards.values()]
        return sum(means) / len(means) if means else 0.0

    def left_out(self) -> int:
        """Episodes left out by error, over all tasks."""
        return sum(sum(kinds.values()) for kinds in self.errors.values())

    def warning(self, label: str, timeout_s: float) -> str | None:
        """What a caller must print when episodes were left out, naming the fix; None when none were."""
        if not self.left_out():
            return None
        parts = []
        for task, kinds in self.errors.items():
            total = len(self.rewards.get(task, [])) + sum(kinds.values())
            what = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items()))
            parts.append(f"{task}: {sum(kinds.values())} of {total} ({what})")
        hint = (
            f"; a timeout is an episode past evaluation.episode_timeout_s ({timeout_s:g} s): raise it for this machine"
            if any("timeout" in kinds for kinds in self.errors.values())
            else ""
        )
        return f"eval {label}: episodes left out of the means by error: {'; '.join(parts)}{hint}"


async def evaluate_policy(
    model: Any, tokenizer: Any, config: TrainConfig, record_dir: Path | None = None
) -> PolicyEval:
    """Evaluation episodes (seeds evaluation.seed .. +episodes-1) of every task: rewards, and errors left out.

    At most `engine.max_batch_size` episodes are in flight: more would not decode faster, and an episode waiting for
    a batch row would spend its time limit in the queue (on a 2-core EPYC 21 of 64 greedy FrozenLake 4x4 episodes
    passed 120 s when all 64 ran at once, and were left out). The limit is `evaluation.episode_timeout_s`."""
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
        pack_prefill=config.engine.pack_prefill,
    )
    sampling = SamplingParams(max_new_tokens=rollout.max_new_tokens, temperature=ev.temperature, top_p=1.0)

    def agents() -> EngineAgent:  # one agent per episode, all batched on the same engine
        return EngineAgent(engine, tokenizer, sampling, max_total_tokens=rollout.max_total_tokens)

    eval_config = EvalConfig(
        max_turns=ev.max_turns or rollout.max_turns,
        episode_timeout_s=ev.episode_timeout_s,
        env_factories={task.env: env_factory(task) for task in config.tasks},
    )
    result = PolicyEval({task.env: [] for task in config.tasks})

    def keep(record: EpisodeRecord) -> None:
        if record.error_kind:
            result.errors.setdefault(record.env_id, Counter())[record.error_kind] += 1
        else:
            result.rewards[record.env_id].append(record.reward)

    if record_dir is not None:
        shutil.rmtree(record_dir, ignore_errors=True)
    try:
        await evaluate(
            [task.env for task in config.tasks],
            agents,
            episodes=ev.episodes,
            seeds=ev.seed,
            concurrency=max(1, min(ev.episodes * len(config.tasks), config.engine.max_batch_size)),
            out_dir=record_dir,
            config=eval_config,
            agent_name="policy",
            on_episode=keep,
        )
    finally:
        await engine.close()
    return result


class BeforeAfter:
    """Collects evaluations under labels (before, sft, after) and writes eval.json plus a printed table."""

    def __init__(self, config: TrainConfig, out_dir: str | Path) -> None:
        self.config = config
        self.path = Path(out_dir) / "eval.json"
        self.results: dict[str, dict[str, list[float]]] = {}
        self.errors: dict[str, dict[str, Counter[str]]] = {}  # label -> task -> error kind -> episodes left out

    async def measure(self, label: str, model: Any, tokenizer: Any) -> None:
        """Evaluate `model` now and keep its rewards under `label`; eval.json is rewritten each time."""
        was_training = model.training
        model.eval()
        started = time.monotonic()
        record_dir = self.path.parent / f"eval-{label}"
        result = await evaluate_policy(model, tokenizer, self.config, record_dir)
        self.results[label], self.errors[label] = result.rewards, result.errors
        model.train(was_training)
        self.write()
        means = ", ".join(f"{task} {mean:.3f}" for task, mean in result.means().items())
        print(f"eval {label}: {means} ({time.monotonic() - started:.0f}s)", flush=True)
        warning = result.warning(label, self.config.evaluation.episode_timeout_s)
        if warning:
            print(f"warning: {warning} (the episodes are in {record_dir}/episodes.jsonl)", flush=True)

    def report(self) -> dict[str, Any]:
        """{task: {label: mean, label_se: standard error, "episodes": n}, "overall": {...}}; a label whose episodes
        were left out by error also has `label_left_out`: {error kind: episodes} (its mean is over the others)."""
        out: dict[str, Any] = {}
        labels = list(self.results)
        for task in (t.env for t in self.config.tasks):
            row: dict[str, Any] = {"episodes": self.config.evaluation.episodes}
            for label in labels:
                row[label], row[f"{label}_se"] = mean_and_se(self.results[label].get(task, []))
                left_out = self.errors.get(label, {}).get(task)
                if left_out:
                    row[f"{label}_left_out"] = dict(sorted(left_out.items()))
            out[task] = row
        overall: dict[str, Any] = {"episodes": self.config.evaluation.episodes * len(self.config.tasks)}
        for label in labels:
            overall[label] = PolicyEval(self.results[label]).overall()
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
