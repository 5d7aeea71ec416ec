"""The questions a planner asks of a measured workload, each answered by a sweep of simulations (`envhub plan
--sweep`): the speedup as engines and env hosts grow, the env hosts per engine beyond which env latency stops being
the bottleneck, the staleness bound that keeps the async speedup, and what redundant rollouts do to the long tail
(at the recorded scale, and with engines and env hosts to spare, where the extra episodes cost no one's time).

Scaling is weak scaling: with N engines a learner step takes N times the groups, N times as many groups may be in
flight and the learner has N data-parallel workers, so each engine sees the load of the recorded one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from envhub.trainer.plan.config import PlanConfig
from envhub.trainer.plan.model import PipelineModel
from envhub.trainer.plan.report import predict

KEEPS = 0.95  # "keeps the speedup": within 5% of the best the sweep found


def scaled(config: PlanConfig, engines: int, env_hosts: int) -> PlanConfig:
    """`config` with `engines` engines (groups per step, groups in flight and learners scaled with them)."""
    return replace(
        config,
        engines=engines,
        env_hosts=env_hosts,
        learners=config.learners * engines,
        groups_per_step=config.groups_per_step * engines,
        concurrent_groups=max(config.concurrent_groups, config.groups_per_step) * engines,
    )


def scaling(
    model: PipelineModel, config: PlanConfig, engines: tuple[int, ...], env_hosts: tuple[int, ...], trials: int
) -> dict[str, Any]:
    """Episodes/s for every (engines, env hosts) pair, and the speedup over one engine and one env host."""
    rates = {(n, m): predict(model, scaled(config, n, m), trials)["episodes_per_s"] for n in engines for m in env_hosts}
    base = rates[engines[0], env_hosts[0]] or 1e-12
    per_engine = {}
    for n in engines:
        best = max(rates[n, m] for m in env_hosts)
        enough = next((m for m in env_hosts if rates[n, m] >= KEEPS * best), env_hosts[-1])
        per_engine[str(n)] = {"env_hosts": enough, "env_hosts_per_engine": round(enough / n, 3)}
    return {
        "episodes_per_s": {str(n): {str(m): rates[n, m] for m in env_hosts} for n in engines},
        "speedup": {str(n): {str(m): round(rates[n, m] / base, 2) for m in env_hosts} for n in engines},
        "env_hosts_needed": per_engine,
    }


def staleness(model: PipelineModel, config: PlanConfig, bounds: tuple[int, ...], trials: int) -> dict[str, Any]:
    """Async episodes/s at each staleness bound over sync's, and the smallest bound keeping the speedup."""
    sync = predict(model, replace(config, mode="sync"), trials)["episodes_per_s"] or 1e-12
    rows = {}
    for s in bounds:
        r = predict(model, replace(config, mode="async", max_staleness=s), trials)
        rows[str(s)] = {"speedup": round(r["episodes_per_s"] / sync, 3), "mean_staleness": r["mean_staleness"]}
    best = max(v["speedup"] for v in rows.values())
    keeps = next(int(s) for s, v in rows.items() if v["speedup"] >= KEEPS * best)
    return {"sync_episodes_per_s": sync, "by_bound": rows, "smallest_bound_keeping_speedup": keeps}


def redundancy(model: PipelineModel, config: PlanConfig, extras: tuple[int, ...], trials: int) -> dict[str, Any]:
    """Episodes/s and group completion times (mean, p90, max) with `extra` spare episodes per group."""
    rows = {}
    for extra in extras:
        r = predict(model, replace(config, redundancy=extra), trials)
        rows[str(extra)] = {"episodes_per_s": r["episodes_per_s"], "group_s": r["group_s"]}
    return rows


def all_sweeps(model: PipelineModel, config: PlanConfig, trials: int = 3) -> dict[str, Any]:
    """Every sweep, on episode-level resampling for redundancy (a recorded group's episodes share a seed, so spares
    drawn from it would finish together)."""
    config = replace(config, steps=max(config.steps, 16))  # long enough that the first step's ramp-up fades
    spare = replace(config, resample="episode", engines=4 * config.engines, env_hosts=8 * config.env_hosts)
    return {
        "scaling": scaling(model, config, (1, 2, 4, 8), (1, 2, 4, 8, 16), trials),
        "staleness": staleness(model, config, (0, 1, 2, 3, 4), trials),
        "redundancy": {
            "recorded_scale": redundancy(model, replace(config, resample="episode"), (0, 1, 2, 4), trials),
            # the same batch on 4x the engines and 8x the env hosts: capacity to spare for the extra episodes
            "engines_to_spare": redundancy(model, spare, (0, 1, 2, 4), trials),
        },
    }


def sweep_tables(sweeps: dict[str, Any]) -> str:
    """The sweeps as short text tables."""
    lines = []
    speed = sweeps["scaling"]["speedup"]
    hosts = list(next(iter(speed.values())))
    lines.append("speedup over 1 engine + 1 env host (rows: engines, columns: env hosts)")
    lines.append(f"{'':>8} " + " ".join(f"{h:>6}" for h in hosts))
    for n, row in speed.items():
        needed = sweeps["scaling"]["env_hosts_needed"][n]["env_hosts"]
        lines.append(f"{n:>8} " + " ".join(f"{row[h]:>6}" for h in hosts) + f"   env hosts needed: {needed}")
    st = sweeps["staleness"]
    lines.append(
        "async/sync by staleness bound: "
        + ", ".join(f"{s}: {v['speedup']}x" for s, v in st["by_bound"].items())
        + f"; smallest bound keeping it: {st['smallest_bound_keeping_speedup']}"
    )
    for scale, rows in sweeps["redundancy"].items():
        lines.append(
            f"redundancy (extra episodes per group), {scale.replace('_', ' ')}: "
            + ", ".join(f"+{r}: {v['episodes_per_s']} ep/s, group p90 {v['group_s']['p90']} s" for r, v in rows.items())
        )
    return "\n".join(lines)
