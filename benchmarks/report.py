"""`envhub bench all --out DIR [--quick]`: one end-to-end report (report.md + report.json) measured in one run.

Sections: env steps/s per env; sandbox acquire and exec latencies (with the backend's own CLI as the
reference); engine tokens/s against a plain `model.generate` loop; async vs sync GRPO speedup; rollout
throughput with 1, 2, 4 and 8 Ray env workers. Every ratio compares two figures taken in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling benchmark scripts

import envhub

ACTIONS = ["up", "right", "down", "left", "crane", "slate", "42", "7", "aeiou", "1", "push", "buy"]
SKIP_ENVS = {"SWE-v0": "needs a sandbox per episode (see the sandbox section)", "WebShop-v0": "needs a browser"}


async def env_steps(seconds: float) -> dict[str, Any]:
    """Steps per second of each single-agent env with cycled text actions (resets counted as time, not steps)."""
    rows: dict[str, Any] = {}
    for spec in envhub.list_envs():
        if (
            "single-agent" not in spec.tags or "benchmark" in spec.tags or spec.source != "envhub"
        ):  # adapted hubs: benchmarks/adapters.py
            continue
        if spec.id in SKIP_ENVS:
            rows[spec.id] = {"skipped": SKIP_ENVS[spec.id]}
            continue
        try:
            env = envhub.make(spec.id)
            steps, episodes, started = 0, 0, time.perf_counter()
            await env.areset(seed=0)
            while time.perf_counter() - started < seconds:
                _, _, terminated, truncated, _ = await env.astep(ACTIONS[steps % len(ACTIONS)])
                steps += 1
                if terminated or truncated:
                    episodes += 1
                    await env.areset(seed=episodes)
            elapsed = time.perf_counter() - started
            await asyncio.to_thread(env.close)
            rows[spec.id] = {"steps": steps, "episodes": episodes, "steps_per_s": round(steps / elapsed, 1)}
        except Exception as exc:  # one broken env must not sink the report
            rows[spec.id] = {"error": f"{type(exc).__name__}: {exc}"}
    return rows


async def sandboxes(n: int) -> dict[str, Any]:
    """Acquire (warm/cold) and exec latencies for each backend available here."""
    import sandbox_pool

    from envhub.sandboxes.images import ensure_rootfs

    out: dict[str, Any] = {}
    for backend in ("bwrap", "docker"):
        try:
            if backend == "bwrap":
                ensure_rootfs(build=False)
            else:
                from envhub.sandboxes.images import ensure_base_image

                await asyncio.to_thread(ensure_base_image)
            out.update(await sandbox_pool.run([backend], n))
        except Exception as exc:
            out[backend] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def engine(model_name: str, prompts: int, max_new_tokens: int) -> dict[str, Any]:
    """EmbeddedEngine batched tokens/s over a sequential model.generate loop, same prompts, greedy."""
    import engine_throughput as et

    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.models import load_model

    model, tokenizer = load_model(model_name, device="cpu")
    batch = et.make_prompts(tokenizer, prompts)
    et.sequential_generate(model, batch[:1], 2)  # warm-up
    seq_out, seq_s = et.sequential_generate(model, batch, max_new_tokens)

    async def batched() -> tuple[list[list[int]], float]:
        eng = EmbeddedEngine(model, tokenizer, max_batch_size=max(64, prompts))
        try:
            await et.engine_generate(eng, batch[:2], 2)  # warm-up
            return await et.engine_generate(eng, batch, max_new_tokens)
        finally:
            await eng.close()

    eng_out, eng_s = asyncio.run(batched())
    seq_rate, eng_rate = sum(map(len, seq_out)) / seq_s, sum(map(len, eng_out)) / eng_s
    return {
        "model": model_name,
        "prompts": prompts,
        "max_new_tokens": max_new_tokens,
        "generate_loop_tokens_per_s": round(seq_rate, 1),
        "engine_tokens_per_s": round(eng_rate, 1),
        "speedup": round(eng_rate / seq_rate, 2),
        "identical_greedy_outputs": sum(a == b for a, b in zip(seq_out, eng_out)),
    }


def async_vs_sync(steps: int) -> dict[str, Any]:
    """The trainer's async vs sync benchmark (latency-bound env, same seeds)."""
    from envhub.trainer import bench

    _register_slow_letters()
    sync, asyn = asyncio.run(bench.measure("sync", steps)), asyncio.run(bench.measure("async", steps))
    return {"sync": sync, "async": asyn, "speedup": round(asyn["episodes_per_s"] / sync["episodes_per_s"], 2)}


def _register_slow_letters() -> None:
    from envhub.trainer.bench import BENCH_ENV, SlowLettersEnv

    if BENCH_ENV not in {s.id for s in envhub.list_envs()}:
        envhub.register(
            BENCH_ENV, SlowLettersEnv, tags=("benchmark",), description="Letters with heavy-tailed step latency"
        )


async def worker_scaling(counts: list[int], episodes: int, per_worker: int) -> dict[str, Any]:
    """Episodes/s with N Ray EnvWorkers, each running at most `per_worker` episodes (its sandbox budget)."""
    import ray

    from envhub.trainer.bench import BENCH_ENV
    from envhub.trainer.config import config_from_dict
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.engines.server.app import start_engine_server
    from envhub.trainer.models import build_policy
    from envhub.trainer.rollout.ray_workers import RayOptions, RayRolloutSource

    _register_slow_letters()
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": BENCH_ENV, "kwargs": {"median_s": 0.25, "sigma": 0.3}}],
            "rollout": {"group_size": 4, "max_new_tokens": 8, "max_turns": 3},
        }
    )
    owns = not ray.is_initialized()
    if owns:
        ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False, configure_logging=False)
    model, tokenizer = build_policy(config.model, 0)
    server = await start_engine_server(EmbeddedEngine(model, tokenizer, max_batch_size=64))
    options = RayOptions(workers=counts[0], episodes_per_worker=per_worker, cpus_per_worker=1)
    source = RayRolloutSource(options, config, server.url)
    rows = {}
    try:
        for n in counts:
            await source.resize(n)
            source.peak_in_flight = 0
            task = config.tasks[0]
            started = time.perf_counter()
            groups = await asyncio.gather(
                *[source.play_group(task, seed, f"s{n}-{seed}") for seed in range(episodes // 4)]
            )
            elapsed = time.perf_counter() - started
            done = sum(len(g or []) for g in groups)
            rows[str(n)] = {
                "episodes": done,
                "seconds": round(elapsed, 2),
                "episodes_per_s": round(done / elapsed, 2),
                "peak_in_flight": source.peak_in_flight,
            }
    finally:
        await source.close()
        await server.stop()
        if owns:
            ray.shutdown()
    base = rows[str(counts[0])]["episodes_per_s"]
    for row in rows.values():
        row["speedup_vs_1"] = round(row["episodes_per_s"] / base, 2)
    return {
        "env": f"{BENCH_ENV} (step latency log-normal, median 0.25 s, sigma 0.3; 1-3 turns)",
        "episodes_per_worker": per_worker,
        "workers": rows,
    }


def _section(name: str, fn: Any, *args: Any) -> Any:
    print(f"[bench all] {name} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        result = asyncio.run(fn(*args)) if asyncio.iscoroutinefunction(fn) else fn(*args)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"[bench all] {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return result


def run_all(quick: bool = False) -> dict[str, Any]:
    """Every section; `quick` shrinks samples and steps so the whole run takes a few minutes on a small CPU."""
    report: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "quick": quick,
    }
    report["env_steps"] = _section("env steps/s", env_steps, 0.5 if quick else 3.0)
    report["sandboxes"] = _section("sandboxes", sandboxes, 5 if quick else 30)
    report["engine"] = _section(
        "engine", engine, "tiny" if quick else "smollm2", 8 if quick else 16, 16 if quick else 32
    )
    report["async_vs_sync"] = _section("async vs sync", async_vs_sync, 3 if quick else 6)
    # quick: 1 and 2 workers, 8 episodes (each worker is a Ray actor importing envhub: with 4 workers and 16 episodes
    # this section was half of the quick run, 31 of 59 s on a quiet 2-core machine)
    counts = [1, 2] if quick else [1, 2, 4, 8]
    report["worker_scaling"] = _section("env workers", worker_scaling, counts, 8 if quick else 64, 2)
    return report


def to_markdown(r: dict[str, Any]) -> str:
    """The report as markdown tables."""
    lines = [
        "# envhub benchmark report",
        "",
        f"{r['time']} on {r['host']} ({r['cpus']} CPUs, Python {r['python']}){' — quick mode' if r['quick'] else ''}",
        "",
    ]
    lines += ["## Env steps/s", "", "| env | steps/s | steps | episodes |", "|---|---:|---:|---:|"]
    for env, row in r["env_steps"].items():
        if "steps_per_s" in row:
            lines.append(f"| {env} | {row['steps_per_s']} | {row['steps']} | {row['episodes']} |")
        elif isinstance(row, dict):
            lines.append(f"| {env} | – | {row.get('skipped') or row.get('error')} | |")
    lines += [
        "",
        "## Sandboxes (ms)",
        "",
        "| backend | warm acquire p50 | cold start p50 | exec p50 | exec p99 | reference exec p50 | exec / reference |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, row in r["sandboxes"].items():
        if isinstance(row, dict) and "exec_roundtrip" in row:
            lines.append(
                f"| {backend} | {row['warm_acquire']['p50_ms']} | {row['cold_start']['p50_ms']} | "
                f"{row['exec_roundtrip']['p50_ms']} | "
                f"{row['exec_roundtrip']['p99_ms']} | {row['reference_exec']['p50_ms']} "
                f"({row['reference_exec']['what']}) | {row['exec_over_reference']}x |"
            )
        elif isinstance(row, dict):
            lines.append(f"| {backend} | {row.get('error', row)} | | | | | |")
    e = r["engine"]
    lines += ["", "## Engine tokens/s", ""]
    lines += (
        [f"{e['error']}"]
        if "error" in e
        else [
            "| model | prompts | new tokens | model.generate loop | EmbeddedEngine batched | speedup |",
            "|---|---:|---:|---:|---:|---:|",
            f"| {e['model']} | {e['prompts']} | {e['max_new_tokens']} | {e['generate_loop_tokens_per_s']} | "
            f"{e['engine_tokens_per_s']} | {e['speedup']}x |",
        ]
    )
    a = r["async_vs_sync"]
    lines += ["", "## Async vs sync GRPO", ""]
    lines += (
        [f"{a['error']}"]
        if "error" in a
        else [
            "| mode | wall s | episodes/s | staleness |",
            "|---|---:|---:|---:|",
            *[
                f"| {m} | {a[m]['wall_s']} | {a[m]['episodes_per_s']} | {a[m]['mean_staleness']} |"
                for m in ("sync", "async")
            ],
            "",
            f"speedup: **{a['speedup']}x**",
        ]
    )
    w = r["worker_scaling"]
    lines += ["", "## Ray env workers", ""]
    lines += (
        [f"{w['error']}"]
        if "error" in w
        else [
            f"{w['env']}; at most {w['episodes_per_worker']} episodes per worker.",
            "",
            "| workers | episodes | most at once | seconds | episodes/s | vs 1 worker |",
            "|---:|---:|---:|---:|---:|---:|",
            *[
                f"| {n} | {row['episodes']} | {row.get('peak_in_flight', '')} | {row['seconds']} | "
                f"{row['episodes_per_s']} | {row['speedup_vs_1']}x |"
                for n, row in w["workers"].items()
            ],
        ]
    )
    return "\n".join(lines) + "\n"


def main(out: str | Path = "bench-report", quick: bool = False) -> int:
    """Run everything, write DIR/report.json and DIR/report.md, print the markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = run_all(quick)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    markdown = to_markdown(report)
    (out / "report.md").write_text(markdown)
    print(markdown)
    print(f"wrote {out / 'report.md'} and {out / 'report.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-report")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sys.exit(main(args.out, args.quick))
