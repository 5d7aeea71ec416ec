"""Async vs sync GRPO throughput at the same model, envs, budget and seeds (`envhub bench async`).

Two workloads, each a real env standing in for an agentic task, used only here; the model, engine, queue and
learner are the production ones, and sync mode is the same code with max_staleness = 0:
- `latency`: Letters-v0 whose every step waits a heavy-tailed (log-normal) time, like a test run in a remote
  sandbox, for 1-3 turns (the waits are real `asyncio.sleep`s);
- `sandbox`: ShellQuiz-v0 in Docker sandboxes from the shared pool, 1-3 turns, every turn a real bash command in
  the episode's sandbox and the last one graded there (the tiny model writes no tool call, so the env makes the call
  a solver would; the reward still depends on the model's text, so groups carry signal).

`--keep-runs DIR` keeps each mode's run directory (DIR/sync, DIR/async): the record `envhub plan` reads.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import envhub
from envhub.envs.letters import LettersEnv
from envhub.envs.shell_quiz import ShellQuizEnv
from envhub.errors import ConfigError
from envhub.toolcalls import ToolCall
from envhub.toolenv import SandboxSpec
from envhub.trainer.config import config_from_dict
from envhub.trainer.run.cpu_usage import cpu_times, cpu_used
from envhub.trainer.train import Trainer

BENCH_ENV = "SlowLetters-v0"
SANDBOX_BENCH_ENV = "SandboxQuiz-v0"


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


class SandboxQuizEnv(ShellQuizEnv):
    """ShellQuiz-v0 that plays the solver's tool calls whatever the model writes: 1-3 turns of a real bash command in
    the episode's sandbox, the last one submitting an answer taken from the model's text and graded in the sandbox.

    `cpuset` pins the sandboxes to those CPUs (e.g. "1"), so the trainer can keep the others (`taskset`).
    """

    def __init__(self, backend: str = "docker", cpuset: str = "", spares: int = 8, max_sandboxes: int = 64) -> None:
        super().__init__(backend=backend, max_steps=3)
        from envhub.sandboxes import SandboxLimits

        limits = SandboxLimits(cpuset=cpuset) if cpuset else None
        self.sandbox_spec = SandboxSpec(
            backend=backend,
            limits=limits,
            command_timeout=10.0,
            pool_size=spares,
            max_pool_size=max_sandboxes,  # type: ignore[arg-type]
        )
        self.turns = 1

    async def setup(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.turns = 1 + int(self.np_random.integers(3))
        return await super().setup(options)

    async def on_text(self, text: str) -> str | None:
        if self.steps < self.turns:
            return (await self.call_tool(ToolCall("bash", {"command": self.command}))).output
        graded = await self.sandbox.exec(f"bash -c {shlex.quote(self.command)}", timeout=10.0, cwd="/workspace")
        if graded.stdout.strip().isdigit():  # the sandbox's count is the truth the answer is graded against
            self.answer = int(graded.stdout.strip())
        return (await self.call_tool(ToolCall("submit", {"answer": str(len(text) % 4)}))).output


@dataclass(frozen=True)
class Workload:
    """One benchmark env and the run settings it is measured with."""

    env: str
    description: str
    env_class: type
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    trainer_cpus: frozenset[int] = frozenset()  # pin the trainer (engine, learner, event loop) to these CPUs


WORKLOADS = {
    "latency": Workload(
        BENCH_ENV,
        "Letters-v0, log-normal wait per step (median 0.3 s, sigma 1.0, cap 6 s); 1-3 turns",
        SlowLettersEnv,
        rollout={"max_new_tokens": 8, "max_turns": 3},
    ),
    "sandbox": Workload(
        SANDBOX_BENCH_ENV,
        "ShellQuiz-v0 in Docker sandboxes (pool of 8 spares); 1-3 turns, each a bash command in the sandbox, "
        "the last graded there",
        SandboxQuizEnv,
        env_kwargs={"backend": "docker"},
        rollout={"max_new_tokens": 8, "max_turns": 3},
    ),
    "sandbox-pinned": Workload(
        SANDBOX_BENCH_ENV,
        "the sandbox workload with the trainer (engine, learner) pinned to CPU 0 and the sandboxes to CPU 1 "
        "(Docker cpuset; dockerd itself is not pinned)",
        SandboxQuizEnv,
        env_kwargs={"backend": "docker", "cpuset": "1"},
        rollout={"max_new_tokens": 8, "max_turns": 3},
        trainer_cpus=frozenset({0}),
    ),
}


def register_workloads() -> None:
    """Register the benchmark envs (once per process)."""
    known = {s.id for s in envhub.list_envs()}
    for workload in WORKLOADS.values():
        if workload.env not in known:
            envhub.register(workload.env, workload.env_class, tags=("benchmark",), description=workload.description)


def _config(
    mode: str, out_dir: str, steps: int, seed: int, workload: str = "latency", env_kwargs: dict | None = None
) -> Any:
    spec = WORKLOADS[workload]
    return config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": spec.env, "kwargs": {**spec.env_kwargs, **(env_kwargs or {})}}],
            "rollout": {"group_size": 4, "concurrent_groups": 8, **spec.rollout},
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


@contextmanager
def _pinned(cpus: frozenset[int]):
    """Run the trainer's threads on `cpus` (threads started inside inherit it), one torch thread per CPU."""
    if not cpus:
        yield
        return
    import torch

    if not cpus <= os.sched_getaffinity(0):
        raise ConfigError(f"CPUs {sorted(cpus)} are not available here", hint="the pinned workload needs 2 CPUs")
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


@contextmanager
def _run_dir(keep: Path | None, mode: str):
    if keep is None:
        with tempfile.TemporaryDirectory(prefix=f"envhub-bench-{mode}-") as out:
            yield out
        return
    path = keep / mode
    if path.exists() and any(path.iterdir()):
        raise ConfigError(f"{path} is not empty", hint="give --keep-runs a new directory")
    path.mkdir(parents=True, exist_ok=True)
    yield str(path)


async def measure(
    mode: str,
    steps: int,
    seed: int = 0,
    *,
    workload: str = "latency",
    keep: str | Path | None = None,
    env_kwargs: dict | None = None,
) -> dict[str, Any]:
    """Train `steps` steps in `mode`; returns wall time (start-up included, the same in both modes) and throughput.

    `pipeline_*` leave the start-up out: from the first episode's start to the last step's end."""
    with _run_dir(Path(keep) if keep is not None else None, mode) as out, _pinned(WORKLOADS[workload].trainer_cpus):
        started, cpu_before = time.time(), cpu_times()
        result = await Trainer(_config(mode, out, steps, seed, workload, env_kwargs)).run(overwrite=True)
        cpu = cpu_used(cpu_before, cpu_times())
        first_episode = _first_episode_start(Path(out))
    rows = result.history
    wall = rows[-1]["elapsed_s"]
    pipeline = wall - (first_episode - started)
    episodes = steps * 2 * 4
    tokens = sum(r["model_tokens"] for r in rows)
    learner_busy = sum(r["learner"]["learner_s"] for r in rows)
    return {
        "mode": mode,
        "steps": steps,
        "wall_s": round(wall, 2),
        "startup_s": round(wall - pipeline, 2),
        "episodes": episodes,
        "episodes_per_s": round(episodes / wall, 3),
        "pipeline_episodes_per_s": round(episodes / pipeline, 3),
        "model_tokens_per_s": round(tokens / wall, 1),
        "learner_busy_s": round(learner_busy, 2),
        "mean_staleness": round(sum(r["staleness"] for r in rows) / len(rows), 2),
        **cpu,
    }


def _first_episode_start(run_dir: Path) -> float:
    from envhub.trainer.run.record import read_episodes

    return min(e["time"] - e["duration_s"] for e in read_episodes(run_dir))


def compare(workload: str, steps: int, seed: int = 0, keep: str | Path | None = None) -> dict[str, Any]:
    """Both modes of one workload, sync first, and the speedups (start-up included, and the pipeline alone)."""
    register_workloads()
    sync = asyncio.run(measure("sync", steps, seed, workload=workload, keep=keep))
    asyn = asyncio.run(measure("async", steps, seed, workload=workload, keep=keep))
    return {
        "workload": workload,
        "env": WORKLOADS[workload].env,
        "latency": WORKLOADS[workload].description,
        "load_average": list(os.getloadavg()),
        "sync": sync,
        "async": asyn,
        "speedup": round(asyn["episodes_per_s"] / sync["episodes_per_s"], 2),
        "pipeline_speedup": round(asyn["pipeline_episodes_per_s"] / sync["pipeline_episodes_per_s"], 2),
    }


def print_table(report: dict[str, Any]) -> None:
    """The two modes side by side."""
    print(
        f"{'mode':<6} {'wall s':>8} {'start s':>8} {'episodes/s':>11} {'tokens/s':>9} {'learner s':>10} {'stale':>6} "
        f"{'CPUs busy':>10}"
    )
    for r in (report["sync"], report["async"]):
        print(
            f"{r['mode']:<6} {r['wall_s']:>8} {r['startup_s']:>8} {r['episodes_per_s']:>11} "
            f"{r['model_tokens_per_s']:>9} {r['learner_busy_s']:>10} {r['mean_staleness']:>6} "
            f"{r['machine_busy']:>10.0%}"
        )
    print(
        f"speedup (async / sync episodes per second): {report['speedup']}x; "
        f"start-up left out: {report['pipeline_speedup']}x"
    )


def main(
    out: str | Path = "async_vs_sync.json",
    steps: int = 6,
    seed: int = 0,
    workload: str = "latency",
    keep_runs: str | Path | None = None,
) -> int:
    """Run both modes, print a table, write JSON with the speedup."""
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}", hint=f"choose one of {', '.join(WORKLOADS)}")
    report = compare(workload, steps, seed, keep_runs)
    if keep_runs is not None:
        report["runs"] = {m: str(Path(keep_runs) / m) for m in ("sync", "async")}
    print_table(report)
    Path(out).write_text(json.dumps(report, indent=2))
    return 0
