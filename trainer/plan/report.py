"""What `envhub plan` reports: predictions averaged over simulated trials, the bounds the stage times imply, the
sweeps a planner asks for (engines and env hosts, staleness bound, redundancy), as JSON and short tables."""

from __future__ import annotations

import statistics
from dataclasses import asdict, replace
from typing import Any

from envhub.trainer.plan.config import PlanConfig, SimResult
from envhub.trainer.plan.model import PipelineModel
from envhub.trainer.plan.record import RunRecord
from envhub.trainer.plan.simulate import simulate


def record_config(record: RunRecord, **overrides: Any) -> PlanConfig:
    """The recorded run's own settings (one engine, one env host, one learner), with `overrides` (None = keep)."""
    algo, rollout = record.config.get("algorithm", {}), record.config.get("rollout", {})
    base = PlanConfig(
        mode=algo.get("mode", "async"),
        max_staleness=float(algo.get("max_staleness", 1)),
        stale=algo.get("stale", "drop"),
        redundancy=int(rollout.get("redundancy", 0)),
        group_size=int(rollout.get("group_size", 4)),
        groups_per_step=int(algo.get("groups_per_step", 2)),
        concurrent_groups=int(rollout.get("concurrent_groups", 4)),
        steps=len(record.steps),
    )
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})


def measured(record: RunRecord) -> dict[str, float]:
    """The recorded run's own throughput (the pipeline: from its first episode to its last step)."""
    config = record_config(record)
    episodes = len(record.steps) * config.groups_per_step * config.group_size
    pipeline = max(record.wall_s - record.startup_s, 1e-9)
    return {
        "mode": config.mode,
        "steps": len(record.steps),
        "startup_s": round(record.startup_s, 3),
        "wall_s": round(record.wall_s, 3),
        "pipeline_s": round(pipeline, 3),
        "episodes_per_s": round(episodes / pipeline, 4),
        "learner_steps_per_s": round(len(record.steps) / pipeline, 4),
    }


def predict(model: PipelineModel, config: PlanConfig, trials: int = 5, startup_s: float = 0.0) -> dict[str, Any]:
    """Mean (and spread over `trials` seeds) of what the simulation predicts for `config`."""
    runs = [simulate(model, replace(config, seed=config.seed + i)) for i in range(trials)]
    return cpu_capped(summarize(runs, startup_s), model, startup_s)


def cpu_capped(summary: dict[str, Any], model: PipelineModel, startup_s: float = 0.0) -> dict[str, Any]:
    """The simulated throughput, bounded by the machine's CPUs when the record says how much CPU an episode takes
    (`CpuModel`): a simulation that overlaps CPU work the machine has no cores for is slowed to the bound, and
    `limited_by` says so."""
    if model.cpu is None:
        return summary
    bound = model.cpu.episodes_per_s
    summary["cpu_bound_episodes_per_s"] = round(bound, 4)
    simulated = summary["episodes_per_s"]
    if simulated <= bound:
        return summary
    scale = bound / simulated
    pipeline = summary["pipeline_s"] / scale
    return summary | {
        "episodes_per_s": round(bound, 4),
        "episodes_per_s_spread": round(summary["episodes_per_s_spread"] * scale, 4),
        "learner_steps_per_s": round(summary["learner_steps_per_s"] * scale, 4),
        "pipeline_s": round(pipeline, 3),
        "wall_s": round(startup_s + pipeline, 3),
        "simulated_episodes_per_s": simulated,
        "limited_by": "cpus",
    }


def summarize(runs: list[SimResult], startup_s: float = 0.0) -> dict[str, Any]:
    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else 0.0

    eps = [r.episodes_per_s for r in runs]
    groups = sorted(g for r in runs for g in r.group_s)
    time_s = mean([r.time_s for r in runs])
    return {
        "episodes_per_s": round(mean(eps), 4),
        "episodes_per_s_spread": round(statistics.pstdev(eps), 4) if len(eps) > 1 else 0.0,
        "learner_steps_per_s": round(mean([r.steps_per_s for r in runs]), 4),
        "pipeline_s": round(time_s, 3),
        "wall_s": round(startup_s + time_s, 3),
        "mean_staleness": round(mean([r.mean_staleness for r in runs]), 3),
        "utilisation": {
            "engine_busy": round(mean([r.engine_busy for r in runs]), 3),
            "engine_batch": round(mean([r.engine_batch for r in runs]), 2),
            "env_host_busy": round(mean([r.env_busy for r in runs]), 3),
            "env_calls_per_host": round(mean([r.env_calls for r in runs]), 2),
            "learner_busy": round(mean([r.learner_busy for r in runs]), 3),
        },
        "stage_s": {k: round(mean([r.stage_s.get(k, 0.0) for r in runs]), 4) for k in runs[0].stage_s},
        "group_s": {
            "mean": round(mean(groups), 3),
            "p90": round(groups[int(0.9 * (len(groups) - 1))], 3) if groups else 0.0,
            "max": round(groups[-1], 3) if groups else 0.0,
        },
        "groups": {
            "filtered": round(mean([r.groups_filtered for r in runs]), 2),
            "failed": round(mean([r.groups_failed for r in runs]), 2),
            "dropped_stale": round(mean([r.groups_dropped for r in runs]), 2),
            "episodes_cancelled": round(mean([r.episodes_cancelled for r in runs]), 2),
        },
        "sandboxes": {
            "cold_acquires": round(mean([r.cold_acquires for r in runs]), 2),
            "acquire_wait_s": round(mean([r.acquire_wait_s for r in runs]), 4),
        },
    }


def bounds(model: PipelineModel, config: PlanConfig, group_s: float) -> dict[str, float]:
    """Upper bounds on episodes/s, one per stage, from base stage costs (the smallest is the bottleneck).

    `group_s` is a group's time from start to finish when nothing waits (the sync simulation's mean)."""
    per_step = config.groups_per_step * config.group_size
    traces = [t for g in model.groups for t in g]
    steps_per_episode = statistics.fmean(sum(s for s, _ in t.turns) for t in traces)
    tokens = statistics.fmean(t.total_tokens for t in traces) * per_step
    learn = model.learner.step_s(tokens, config.learners) + statistics.fmean(model.publish_s)
    batch = model.engine.max_batch
    engine = config.engines * batch / model.engine.step_s(batch) / steps_per_episode
    # the queue admits (max_staleness + 1) steps' worth of groups beyond those consumed; sync: one step's
    in_flight = min(
        max(config.concurrent_groups, config.groups_per_step),
        config.staleness.capacity(0, config.groups_per_step),
    )
    out = {
        "learner": round(per_step / learn, 4) if learn > 0 else float("inf"),
        "engines": round(engine, 4),
        # one device serving both: its seconds per episode are the engine's share plus the learner's
        **(
            {"engine_and_learner_device": round(1 / (1 / engine + learn / per_step), 4)}
            if model.shared != "none" and config.engines == 1
            else {}
        ),
        "in_flight_groups": round(in_flight * config.group_size / group_s, 4) if group_s > 0 else float("inf"),
    }
    if model.cpu is not None:
        out["cpus"] = round(model.cpu.episodes_per_s, 4)  # the machine's CPUs over the CPU work of an episode
    if config.env_slots:
        env_s = statistics.fmean(t.reset_work + sum(w for _, w in t.turns) + t.close_s for t in traces)
        out["env_hosts"] = round(config.env_hosts * config.env_slots / env_s, 4) if env_s > 0 else float("inf")
    return out


def model_summary(model: PipelineModel) -> dict[str, Any]:
    """The fitted coefficients and what was assumed rather than fitted."""
    pool = model.pool
    return {
        "shared": model.shared,
        "engine": asdict(model.engine),
        "env": asdict(model.env),
        "learner": asdict(model.learner),
        "sandbox_pool": None
        if pool is None
        else {"spares": pool.spares, "create_s_mean": round(statistics.fmean(pool.create_s), 4)},
        "cpu": None if model.cpu is None else asdict(model.cpu),
        "groups_recorded": len(model.groups),
        "filtered": round(model.filtered, 4),
        "failed": round(model.failed, 4),
        "publish_s_mean": round(statistics.fmean(model.publish_s), 4),
        "notes": model.notes,
    }


def plan_report(record: RunRecord, model: PipelineModel, config: PlanConfig, trials: int = 5) -> dict[str, Any]:
    """The whole plan: the record's measured run, its replay (validation), the prediction, bounds."""
    replay = predict(model, record_config(record, seed=config.seed), trials, record.startup_s)
    prediction = predict(model, config, trials, record.startup_s)
    sync_groups = predict(model, replace(config, mode="sync"), max(trials // 2, 1))["group_s"]["mean"]
    seen = measured(record)
    return {
        "run": {"dir": str(record.run_dir), **seen},
        "model": model_summary(model),
        "config": asdict(config),
        "replay": replay,
        "replay_error": round(replay["episodes_per_s"] / seen["episodes_per_s"] - 1, 4),
        "prediction": prediction,
        "speedup_vs_record": round(prediction["episodes_per_s"] / seen["episodes_per_s"], 3),
        "speedup_vs_replay": round(prediction["episodes_per_s"] / max(replay["episodes_per_s"], 1e-12), 3),
        "bounds_episodes_per_s": bounds(model, config, sync_groups),
    }


def table(report: dict[str, Any]) -> str:
    """A short table: the record, its replay and the prediction side by side."""
    run, replay, pred = report["run"], report["replay"], report["prediction"]
    config = report["config"]
    lines = [
        f"{'':<34} {'episodes/s':>10} {'steps/s':>8} {'engine':>7} {'env':>6} {'learner':>8} {'stale':>6}",
        f"{'recorded (' + run['mode'] + ')':<34} {run['episodes_per_s']:>10} {run['learner_steps_per_s']:>8}",
    ]
    for name, r in (("replayed (" + run["mode"] + ")", replay), (_describe(config), pred)):
        u = r["utilisation"]
        lines.append(
            f"{name:<34} {r['episodes_per_s']:>10} {r['learner_steps_per_s']:>8} {u['engine_busy']:>7} "
            f"{u['env_host_busy']:>6} {u['learner_busy']:>8} {r['mean_staleness']:>6}"
        )
    b = report["bounds_episodes_per_s"]
    lines.append("bounds (episodes/s): " + ", ".join(f"{k} {v}" for k, v in b.items()))
    if pred.get("limited_by") == "cpus":
        lines.append(
            f"the machine's CPUs bound the prediction: {pred['simulated_episodes_per_s']} episodes/s simulated, "
            f"at most {pred['episodes_per_s']} with {report['model']['cpu']['machine_s']:.3g} CPU s an episode"
        )
    lines.append(
        f"predicted / recorded: {report['speedup_vs_record']}x (replay error {report['replay_error']:+.1%}); "
        f"predicted / replayed: {report['speedup_vs_replay']}x"
    )
    return "\n".join(lines)


def _describe(config: dict[str, Any]) -> str:
    return (
        f"{config['mode']} E{config['engines']} H{config['env_hosts']} L{config['learners']} "
        f"s{config['max_staleness']:g} r{config['redundancy']}"
    )
