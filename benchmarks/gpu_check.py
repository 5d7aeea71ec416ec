"""The GPU check: the embedded engine, a learner step and the one-GPU recipe on one H100/H200, in one run of at most
five minutes, every stage's figures written to one JSON file as soon as that stage ends.

    python benchmarks/gpu_check.py [--out benchmarks/results/gpu_check.json] [--device cuda|cpu] [--small]
        [--assets .gpu] [--stages environment,engine,learner,recipe] [--budget-s 270] [--work DIR] [--keep]

Each stage runs in a process of its own (its own peak memory and time cap); one that fails or runs out of time
leaves the tail of its log and the figures it had written so far, and the next one starts.

- environment: GPU, Python, torch and transformers versions; the roofline references measured in a few seconds: a
  bf16 matmul's TFLOP/s and a device-to-device copy's GB/s (bytes read plus bytes written).
- engine: the embedded engine on SmolLM2-135M's shape (CUDA graphs on), 64 sequences x (1024 prompt + 256 new)
  tokens, temperature 1: tokens/s of the batch (the first, cold batch captures the graphs and is reported apart) and
  the decode step's bytes over its time against the memory bandwidth (`benchmarks/engines.py`'s figures); greedy
  tokens against a transformers forward of the same weights (bf16 and fp32).
- learner: one GRPO step (`benchmarks/learner_speed.py`'s batch, shaped by the one-GPU recipe) on SmolLM2-135M's
  shape with fp32 masters and bf16 autocast: trained tokens/s, TFLOP/s, peak memory against the dry-run's arithmetic.
- recipe: configs/qwen2.5-1.5b-1gpu.yaml for 2 steps on a Qwen2.5-1.5B-shaped model with random weights, evaluation
  off; the GPU's peak memory in use against `envhub train --dry-run`'s figure for GPU 0 (pass: within 20%).

Models are built where the check runs, with random weights (no weights of this size travel to the GPU machine);
speed and memory do not depend on them. The tokenizer is SmolLM2's (Qwen2.5's is not available offline): the
Qwen-shaped model keeps Qwen2.5's vocabulary of 151936 rows, so ids past the tokenizer's 49152 decode to nothing.
`--small` (with `--device cpu`) shrinks every shape and workload so that each code path runs on a CPU in a few
minutes before a GPU run. `benchmarks/gpu_check_prep.sh` prepares `.gpu/` (assets and wheels) and
`benchmarks/gpu_check_run.sh` runs the check on a GPU machine (docs/engines.md, "GPU check").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
#: seconds each stage may take on the GPU; --budget-s (270: with the installs, five minutes) caps their sum; --small
#: doubles both
STAGE_CAPS = {"environment": 20, "engine": 55, "learner": 35, "recipe": 170}
ENGINE_GOAL_TOKENS_PER_S = 20_000  # SmolLM2-135M's shape, 64 x ~1k tokens (issue 47)
MEMORY_TOLERANCE = 0.2  # the recipe's measured peak within 20% of the dry-run's figure


# -- arithmetic ----------------------------------------------------------------------------------------------------
def memory_verdict(measured: float, planned: float, tolerance: float = MEMORY_TOLERANCE) -> dict[str, Any]:
    """Measured peak over the planned figure, and whether it lies within `tolerance` of it (either side)."""
    if planned <= 0:
        return {"ratio": None, "within": False, "tolerance": tolerance}
    ratio = measured / planned
    return {"ratio": round(ratio, 3), "within": abs(ratio - 1) <= tolerance, "tolerance": tolerance}


def copy_gbps(nbytes: int, seconds: float) -> float:
    """A copy's bandwidth in GB/s counting the bytes read and the bytes written."""
    return 2 * nbytes / seconds / 1e9


def summarize(stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The headline figures of whatever stages have results, each against its reference or goal."""
    figures = {name: stage.get("result") or {} for name, stage in stages.items()}
    env, engine, learner, recipe = (figures.get(k, {}) for k in ("environment", "engine", "learner", "recipe"))
    out: dict[str, Any] = {"stages": {name: stage.get("status") for name, stage in stages.items()}}
    if "tokens_per_s" in engine:
        out["engine_tokens_per_s"] = engine["tokens_per_s"]
        out["engine_meets_goal"] = engine["tokens_per_s"] >= ENGINE_GOAL_TOKENS_PER_S
        decode = engine.get("decode", {})
        out["engine_fraction_of_bandwidth_bound"] = decode.get("fraction_of_bandwidth_bound")
        if decode.get("achieved_gbps") and env.get("copy_gbps"):
            out["engine_fraction_of_measured_copy"] = round(decode["achieved_gbps"] / env["copy_gbps"], 3)
    if "trained_tokens_per_s" in learner:
        out["learner_trained_tokens_per_s"] = learner["trained_tokens_per_s"]
        if env.get("bf16_matmul_tflops"):
            out["learner_share_of_bf16_matmul"] = round(learner["tflops"] / env["bf16_matmul_tflops"], 3)
    if "memory" in recipe:
        out["recipe_memory_ratio"] = recipe["memory"]["ratio"]
        out["recipe_memory_within"] = recipe["memory"]["within"]
    return out


def log_tail(path: Path, lines: int = 25) -> str:
    """The last `lines` lines of a stage's log (a traceback's tail when it failed)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` with `data` in one rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


# -- the runner: one process per stage -----------------------------------------------------------------------------
def run_stage(name: str, cap_s: float, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """Run one stage in its own process for at most `cap_s` seconds; its output goes to `log` and to stdout."""
    result = log.with_suffix(".json")
    result.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--stage", name, "--result", str(result), "--device", args.device]
    command += ["--assets", str(args.assets), "--work", str(args.work)] + (["--small"] if args.small else [])
    started = time.monotonic()
    with log.open("w") as sink:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        tee = threading.Thread(target=_tee, args=(child.stdout, sink), daemon=True)
        tee.start()
        try:
            code: int | None = child.wait(timeout=cap_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the stage and anything it started
            child.wait()
            code = None
        tee.join(timeout=5)
    status = "ok" if code == 0 else ("timeout" if code is None else "error")
    stage: dict[str, Any] = {"status": status, "seconds": round(time.monotonic() - started, 1), "cap_s": round(cap_s)}
    if result.exists():
        stage["result"] = json.loads(result.read_text())
    if status != "ok":
        stage["error"] = f"exit code {code}" if code is not None else f"stopped after its cap of {cap_s:.0f} s"
        stage["log_tail"] = log_tail(log)
    return stage


def _tee(stream: Any, sink: Any) -> None:
    for line in stream:
        sink.write(line)
        sink.flush()
        print(line, end="", flush=True)


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every stage in order within `args.budget_s`; the JSON is rewritten after each."""
    out = Path(args.out)
    names = [n.strip() for n in args.stages.split(",") if n.strip()]
    unknown = [n for n in names if n not in STAGE_CAPS]
    if unknown:
        raise SystemExit(f"unknown stages {unknown}; choose from {', '.join(STAGE_CAPS)}")
    report: dict[str, Any] = {
        "check": "benchmarks/gpu_check.py",
        "device": args.device,
        "small": args.small,
        "host": platform.node(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "stages": {},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    for name in names:
        cap = min(STAGE_CAPS[name] * (2 if args.small else 1), deadline - time.monotonic())
        if cap < 5:
            report["stages"][name] = {"status": "skipped", "error": "the run's time budget was spent"}
        else:
            print(f"== {name} (cap {cap:.0f} s)", flush=True)
            report["stages"][name] = run_stage(name, cap, args, out.with_name(f"{out.stem}-{name}.log"))
        report["summary"] = summarize(report["stages"])
        report["seconds"] = round(args.budget_s - (deadline - time.monotonic()), 1)
        write_json(out, report)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/gpu_check.json")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu (with --small) to try every path here")
    parser.add_argument("--small", action="store_true", help="tiny shapes and workloads (a CPU run of every path)")
    parser.add_argument("--assets", default=str(ROOT / ".gpu"), help="what gpu_check_prep.sh wrote")
    parser.add_argument("--stages", default=",".join(STAGE_CAPS))
    parser.add_argument("--budget-s", type=float, default=270.0, help="the whole run's seconds (x2 with --small)")
    parser.add_argument("--work", default="", help="where models and the recipe's run go (default: a fresh folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--stage", help=argparse.SUPPRESS)  # a stage's own process
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        from gpu_check_stages import STAGES, partial_writer

        STAGES[args.stage](args, partial_writer(Path(args.result)))
        return
    if args.small:
        args.budget_s *= 2
    if not (Path(args.assets) / "smollm2" / "tokenizer.json").exists():
        raise SystemExit(f"{args.assets}/smollm2 has no tokenizer: run `bash benchmarks/gpu_check_prep.sh` first")
    made_work = not args.work
    args.work = args.work or work_folder(args.small)
    try:
        report = run_all(args)
    finally:
        if made_work and not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {args.out}")
    sys.exit(0 if all(s["status"] == "ok" for s in report["stages"].values()) else 1)


def work_folder(small: bool) -> str:
    """A fresh folder for the built models and the recipe's run: in memory (/dev/shm) when it has room for the
    1.5B model and its checkpoint (~25 GB), else /tmp."""
    import tempfile

    shm = Path("/dev/shm")
    roomy = shm.is_dir() and shutil.disk_usage(shm).free > 48 * GIB
    return tempfile.mkdtemp(prefix="envhub-gpu-check-", dir=str(shm) if roomy and not small else None)


if __name__ == "__main__":
    main()
