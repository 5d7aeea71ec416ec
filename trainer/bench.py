"""Async vs sync GRPO throughput at the same model, envs, budget and seeds (`envhub bench async`).

Episode lengths vary the way SWE and game tasks do: the benchmark env waits a heavy-tailed
(log-normal) time at every step, standing in for a test run in a sandbox, and lasts 1-3 turns. The
waits are real `asyncio.sleep`s inside a real env, used only here; the model, engine, queue and
learner are the production ones. Sync mode is the same code with max_staleness = 0.
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import envhub
from envhub.envs.letters import LettersEnv
from envhub.trainer.config import config_from_dict
from envhub.trainer.train import Trainer

BENCH_ENV = "SlowLetters-v0"


class SlowLettersEnv(LettersEnv):
    """Letters-v0 with a heavy-tailed latency per step (median `median_s`, log-normal sigma) and 1-3 turns."""

    def __init__(self, median_s: float = 0.3, sigma: float = 1.0, max_latency_s: float = 6.0) -> None:
        super().__init__(letters="aeiou", turns=1)
        self.median_s, self.sigma, self.max_latency_s = median_s, sigma, max_latency_s

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        obs, info = self.reset(seed=seed, options=options)
        self.turns = 1 + int(self.np_random.integers(3))
        return obs, info

    async def astep(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        latency = min(
            self.max_latency_s, self.median_s * math.exp(self.sigma * float(self.np_random.standard_normal()))
        )
        await asyncio.sleep(latency)
        return self.step(action)


def _config(mode: str, out_dir: str, steps: int, seed: int) -> Any:
    return config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": BENCH_ENV}],
            "rollout": {"group_size": 4, "max_new_tokens": 8, "max_turns": 3, "concurrent_groups": 8},
            "algorithm": {
                "mode": mode,
                "groups_per_step": 2,
                "lr": 0.01,
                "max_staleness": 2,
                "filter_zero_variance": False,
            },
            "budget": {"steps": steps, "checkpoint_every": 10_000},
            "seed": seed,
            "out_dir": out_dir,
        }
    )


async def measure(mode: str, steps: int, seed: int = 0) -> dict[str, Any]:
    """Train `steps` steps in `mode`; returns wall time (start-up included, the same in both modes) and throughput."""
    with tempfile.TemporaryDirectory(prefix=f"envhub-bench-{mode}-") as out:
        result = await Trainer(_config(mode, out, steps, seed)).run()
    rows = result.history
    wall = rows[-1]["elapsed_s"]
    episodes = steps * 2 * 4
    tokens = sum(r["model_tokens"] for r in rows)
    learner_busy = sum(r["learner"]["learner_s"] for r in rows)
    return {
        "mode": mode,
        "steps": steps,
        "wall_s": round(wall, 2),
        "episodes": episodes,
        "episodes_per_s": round(episodes / wall, 3),
        "model_tokens_per_s": round(tokens / wall, 1),
        "learner_busy_s": round(learner_busy, 2),
        "mean_staleness": round(sum(r["staleness"] for r in rows) / len(rows), 2),
    }


def main(out: str | Path = "async_vs_sync.json", steps: int = 6, seed: int = 0) -> int:
    """Run both modes, print a table, write JSON with the speedup."""
    if BENCH_ENV not in {s.id for s in envhub.list_envs()}:
        envhub.register(
            BENCH_ENV, SlowLettersEnv, tags=("benchmark",), description="Letters with heavy-tailed step latency"
        )
    sync = asyncio.run(measure("sync", steps, seed))
    asyn = asyncio.run(measure("async", steps, seed))
    report = {
        "env": BENCH_ENV,
        "latency": "log-normal per step, median 0.3 s, sigma 1.0, cap 6 s; 1-3 turns",
        "sync": sync,
        "async": asyn,
        "speedup": round(asyn["episodes_per_s"] / sync["episodes_per_s"], 2),
    }
    print(f"{'mode':<6} {'wall s':>8} {'episodes/s':>11} {'tokens/s':>9} {'learner s':>10} {'staleness':>9}")
    for r in (sync, asyn):
        print(
            f"{r['mode']:<6} {r['wall_s']:>8} {r['episodes_per_s']:>11} {r['model_tokens_per_s']:>9} "
            f"{r['learner_busy_s']:>10} {r['mean_staleness']:>9}"
        )
    print(f"speedup (async / sync episodes per second): {report['speedup']}x")
    Path(out).write_text(json.dumps(report, indent=2))
    return 0
