"""Does an unmodified agent program learn under envhub's GRPO? Evaluate it, train it, evaluate it again.

    python benchmarks/harness_learning.py [--config configs/harness-learning.yaml] [--episodes 128]
        [--seed 1000] [--out benchmarks/results/harness_learning.json]

The harness is the config's task's (`openai-agents` in configs/harness-learning.yaml: the OpenAI Agents SDK from
PyPI, unmodified) on that task's env. Three commands, each as a user would run it:
1. `envhub eval ENV --agent MODEL --harness H --temperature T -n EPISODES`: the starting point, the config's model
   served by the embedded engine through the recording gateway, sampled at the config's rollout temperature;
2. `envhub train CONFIG`: GRPO through the same harness (the gateway records every call token for token);
3. the same `envhub eval` with `--agent hf:<the run's last checkpoint>`, on the same task seeds.
Each episode's reward is read from the eval's episodes.jsonl (an episode the harness ended with an error scores 0:
the policy's failure, as `harness_errors: zero` trains it). The gain is after - before with the standard error of
the difference of two independent means; the goal (issue 46) is a gain beyond 2 SE within 30 CPU-minutes.

CPU time is the whole machine's (user + system from /proc/stat), since the harness runs in sandboxes whose
processes no rusage of ours counts: run it on an otherwise idle machine (the load average before and after is
written beside it).

Sample size, fixed before the decisive run (2026-12-01): 128 episodes per evaluation. The reward is the share of
vowels in one reply, in [0, 1], 0 for a cut reply; at an SD of 0.3 per episode (a pilot's figure replaces it only
if written here first) each mean's SE is 0.027 and the difference's 0.037, so a gain of 0.075 is 2 SE.
The pilot (2026-12-01, 32 episodes per evaluation, seed 1000, not the decisive set; quiet 2-core Xeon): 0.156 ± 0.034
(19 of 32 replies cut at 48 tokens, the SDK's error) -> 0.357 ± 0.018 (2 cut) after 12 steps, SD 0.19 and 0.10, in
11.0 CPU-minutes; the decisive run keeps 128 episodes, seed 1000 and the config as they are.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def machine_cpu_s() -> float:
    """User + system seconds of every process on the machine so far (/proc/stat, all CPUs)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system = (int(v) for v in fields[:3])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def timed(command: list[str]) -> dict[str, float]:
    """Run `command` (a failure stops the benchmark with its output) and return its wall and machine CPU seconds."""
    started, cpu = time.monotonic(), machine_cpu_s()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return {"wall_s": round(time.monotonic() - started, 1), "cpu_s": round(machine_cpu_s() - cpu, 1)}


def evaluate(agent: str, task: dict[str, Any], config: dict[str, Any], args: argparse.Namespace, out: Path) -> dict:
    """One `envhub eval` through the task's harness; its rewards' mean and standard error."""
    rollout = config.get("rollout", {})
    command = [sys.executable, "-m", "envhub.cli.main", "eval", task["env"], "--agent", agent]
    command += ["--harness", task["harness"], "-n", str(args.episodes), "--seed", str(args.seed), "--quiet"]
    command += [
        "--temperature",
        str(rollout.get("temperature", 1.0)),
        "--max-tokens",
        str(rollout.get("max_new_tokens", 48)),
    ]
    command += ["--episode-timeout", str(rollout.get("episode_timeout_s", 300)), "--out", str(out)]
    if task.get("kwargs"):
        command += ["--kwargs", json.dumps(task["kwargs"])]
    cost = timed(command)
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    rewards = [float(r["reward"]) for r in records]
    mean = sum(rewards) / len(rewards)
    sd = math.sqrt(sum((r - mean) ** 2 for r in rewards) / max(1, len(rewards) - 1))
    return {
        "agent": agent,
        "episodes": len(rewards),
        "mean": round(mean, 4),
        "sd": round(sd, 4),
        "se": round(sd / math.sqrt(len(rewards)), 4),
        "errors": sum(bool(r["error"]) for r in records),
        **cost,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "harness-learning.yaml")
    parser.add_argument("--episodes", type=int, default=128, help="episodes per evaluation (fixed in the docstring)")
    parser.add_argument("--seed", type=int, default=1000, help="first task seed of both evaluations")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "harness_learning.json")
    args = parser.parse_args()
    config = yaml.safe_load(args.config.read_text())
    harness_tasks = [t for t in config["tasks"] if t.get("harness")]
    if len(harness_tasks) != 1 or len(config["tasks"]) != 1:
        sys.exit(f"{args.config}: the benchmark needs exactly one task, played by a harness")
    task = harness_tasks[0]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="envhub-harness-learning-") as scratch:
        root = Path(scratch)
        model = config["model"]["name"]
        before = evaluate(model, task, config, args, root / "before")
        run_dir = root / "run"
        train = timed([sys.executable, "-m", "envhub.cli.main", "train", str(args.config), "--out", str(run_dir)])
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
        if not checkpoints:
            sys.exit(f"the run left no checkpoint in {run_dir / 'checkpoints'}")
        after = evaluate(f"hf:{checkpoints[-1]}", task, config, args, root / "after")
    gain = after["mean"] - before["mean"]
    gain_se = math.sqrt(before["se"] ** 2 + after["se"] ** 2)
    cpu_s = before["cpu_s"] + train["cpu_s"] + after["cpu_s"]
    result = {
        "config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config),
        "env": task["env"],
        "harness": task["harness"],
        "model": model,
        "before": before,
        "train": {
            **train,
            "steps": len(rows),
            "batch_reward": [round(r["batch_reward"], 4) for r in rows],
            "merged_share": [r.get("merged_share") for r in rows],
        },
        "after": {**after, "agent": f"hf:<run>/checkpoints/{checkpoints[-1].name}"},
        "gain": round(gain, 4),
        "gain_se": round(gain_se, 4),
        "beats_start_by_2se": gain > 2 * gain_se,
        "cpu_minutes": round(cpu_s / 60, 1),
        "within_30_cpu_minutes": cpu_s <= 30 * 60,
        "load_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{task['harness']} on {task['env']}: {before['mean']:.3f} ± {before['se']:.3f} -> {after['mean']:.3f} ± "
        f"{after['se']:.3f} (gain {gain:+.3f}, 2 SE {2 * gain_se:.3f}: "
        f"{'beats' if result['beats_start_by_2se'] else 'does not beat'} its start) after {len(rows)} steps, "
        f"{result['cpu_minutes']} CPU-minutes of the machine; {args.out}"
    )


if __name__ == "__main__":
    main()
