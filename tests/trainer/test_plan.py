"""`envhub plan`: the simulator against closed forms, its properties, and a real tiny run's record read back."""

import asyncio
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from envhub.errors import ConfigError
from envhub.trainer.plan.config import PlanConfig
from envhub.trainer.plan.model import (
    CpuModel,
    EngineModel,
    EnvModel,
    EpisodeTrace,
    LearnerModel,
    PipelineModel,
    fit_cpu,
    fit_model,
)
from envhub.trainer.plan.record import read_run
from envhub.trainer.plan.report import bounds, measured, plan_report, predict, record_config
from envhub.trainer.plan.simulate import simulate

# one xdist unit: the module's tests run in one go on one worker, so its module-scoped tiny run is made once
# (handed out one by one, they interleave with other modules' tests and pytest tears it down between them)
pytestmark = pytest.mark.xdist_group("plan")


def pipeline(gen_steps=10, step_s=0.1, per_row=0.0, env_s=1.0, learn_s=3.0, groups=None, per_call=0.0, pool=None):
    """A hand-made model: every episode one turn of `gen_steps` engine steps and one env call of `env_s`."""
    episode = EpisodeTrace(0.0, 0.0, ((gen_steps, env_s),), 0.0, total_tokens=100, sandboxed=pool is not None)
    return PipelineModel(
        engine=EngineModel(t0=step_s, t1=per_row, max_batch=64),
        env=EnvModel(e1=per_call),
        learner=LearnerModel(a=learn_s),
        pool=pool,
        groups=groups or [[episode] * 4],
        publish_s=[0.0],
        filtered=0.0,
        failed=0.0,
        shared="none",
    )


def test_sync_with_one_engine_and_fixed_times_is_the_sum_of_the_stages():
    model = pipeline(gen_steps=10, step_s=0.1, env_s=1.0, learn_s=3.0)  # generate 1 s, env 1 s, learn 3 s
    result = simulate(model, PlanConfig(mode="sync", steps=5, groups_per_step=2, concurrent_groups=8))
    assert result.time_s == pytest.approx(5 * (1.0 + 1.0 + 3.0))
    assert result.steps_per_s == pytest.approx(1 / 5.0)
    assert result.episodes_per_s == pytest.approx(2 * 4 / 5.0)
    assert result.mean_staleness == 0.0 and result.groups_dropped == 0


def test_async_is_bounded_by_the_slowest_stage_and_never_slower_than_sync():
    model = pipeline(gen_steps=10, step_s=0.1, env_s=1.0, learn_s=3.0)
    config = PlanConfig(mode="async", max_staleness=2, steps=20, groups_per_step=2, concurrent_groups=8)
    result = simulate(model, config)
    gaps = [b - a for a, b in zip(result.step_ends, result.step_ends[1:])]
    assert gaps[-5:] == pytest.approx([3.0] * 5)  # steady state: the learner, the slowest stage, sets the pace
    assert result.time_s == pytest.approx(2.0 + 20 * 3.0)  # the first batch's rollout, then back-to-back steps
    assert result.learner_busy == pytest.approx(60 / 62)
    sync = simulate(model, replace(config, mode="sync"))
    assert result.episodes_per_s > sync.episodes_per_s
    assert 0 < result.mean_staleness <= config.max_staleness + 1 and sync.mean_staleness == 0


def test_cpu_work_the_machine_has_no_cores_for_bounds_the_prediction():
    # env calls of 1 s overlap freely in the simulation; with 0.5 CPU s an episode on 2 CPUs, 4 episodes/s at most
    model = replace(pipeline(gen_steps=1, step_s=0.001, env_s=1.0, learn_s=0.01), shared="all")
    config = PlanConfig(mode="async", max_staleness=2, steps=20, groups_per_step=2, concurrent_groups=8)
    free = predict(model, config, trials=2)
    assert "limited_by" not in free and free["episodes_per_s"] > 5.0
    bound = predict(replace(model, cpu=CpuModel(cpus=2, machine_s=0.5, trainer_s=0.1)), config, trials=2)
    assert bound["limited_by"] == "cpus" and bound["episodes_per_s"] == 4.0 == bound["cpu_bound_episodes_per_s"]
    assert bound["simulated_episodes_per_s"] == free["episodes_per_s"]
    assert bound["pipeline_s"] == pytest.approx(free["pipeline_s"] * free["episodes_per_s"] / 4.0, rel=1e-3)
    slower = 4.0 / free["episodes_per_s"]
    assert bound["learner_steps_per_s"] == pytest.approx(free["learner_steps_per_s"] * slower, rel=1e-3)
    assert bounds(replace(model, cpu=CpuModel(2, 0.5, 0.1)), config, group_s=1.0)["cpus"] == 4.0
    # a machine with cores to spare leaves the simulation alone
    spare = predict(replace(model, cpu=CpuModel(cpus=2, machine_s=0.01, trainer_s=0.01)), config, trials=2)
    assert "limited_by" not in spare and spare["episodes_per_s"] == free["episodes_per_s"]


def test_cpu_per_episode_comes_from_the_rows_since_the_last_restart(tiny_run):
    record = read_run(tiny_run)
    first, last = record.cpu
    one = len([e for e in record.episodes if first.time < max(s.end for s in e.spans) <= last.time])
    assert fit_cpu(record).machine_s == pytest.approx((last.machine_s - first.machine_s) / one)
    # a resumed run's counters start again: the rows before the restart are not mixed in
    before = replace(first, time=first.time - 1.0, machine_s=first.machine_s + 1e6)
    restart = replace(first, machine_s=0.0, trainer_s=0.0)
    resumed = replace(record, cpu=[before, restart, last])
    assert fit_cpu(resumed).machine_s == pytest.approx(last.machine_s / one)
    assert fit_cpu(replace(record, cpu=[last])) is None and fit_cpu(replace(record, cpu=[])) is None


def test_async_with_a_slow_rollout_is_bounded_by_groups_in_flight():
    model = pipeline(gen_steps=1, step_s=0.001, env_s=10.0, learn_s=0.5)  # rollouts dominate
    config = PlanConfig(mode="async", max_staleness=1, steps=12, groups_per_step=2, concurrent_groups=2)
    result = simulate(model, config)
    # two groups in flight, each 10 s: one step's worth every ~10 s, however fast the learner is
    assert result.steps_per_s == pytest.approx(1 / 10.0, rel=0.08)
    more = simulate(model, replace(config, concurrent_groups=4))  # the staleness bound then allows 4
    assert more.steps_per_s == pytest.approx(2 / 10.0, rel=0.1)


def groups_with_spread():
    """Recorded groups whose episodes differ (env times 0.5-4 s) and turns vary."""

    def turns(g, e):
        return tuple((8, 0.5 * (1 + (g + e + t) % 4)) for t in range(1 + (g + e) % 3))

    return [[EpisodeTrace(0.0, 0.1, turns(g, e), 0.0, 50, False) for e in range(4)] for g in range(5)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_more_engines_and_env_hosts_are_never_slower(mode):
    model = pipeline(step_s=0.02, per_row=0.01, learn_s=0.5, groups=groups_with_spread(), per_call=0.2)
    config = PlanConfig(mode=mode, max_staleness=2, steps=8, groups_per_step=2, concurrent_groups=8)
    rates = [
        sum(simulate(model, replace(config, engines=n, seed=s)).episodes_per_s for s in range(3)) for n in (1, 2, 4)
    ]
    assert rates[0] <= rates[1] * 1.001 and rates[1] <= rates[2] * 1.001
    hosts = [
        sum(simulate(model, replace(config, env_hosts=m, seed=s)).episodes_per_s for s in range(3)) for m in (1, 2, 4)
    ]
    assert hosts[0] <= hosts[1] * 1.001 and hosts[1] <= hosts[2] * 1.001 and hosts[0] < hosts[2]


def test_redundancy_keeps_the_first_finished_and_cancels_the_rest():
    model = pipeline(groups=groups_with_spread(), learn_s=0.2)
    config = PlanConfig(mode="async", steps=6, redundancy=2, resample="episode", max_staleness=1)
    result = simulate(model, config)
    assert result.episodes_cancelled > 0 and result.episodes_started >= result.episodes_trained + 2 * 6 * 2
    tail = simulate(model, replace(config, redundancy=0))
    assert max(result.group_s) <= max(tail.group_s)


def test_a_dry_sandbox_pool_makes_cold_starts():
    from envhub.trainer.plan.model import PoolModel

    model = pipeline(env_s=0.1, learn_s=0.1, pool=PoolModel(spares=2, create_s=(1.0,)))
    result = simulate(model, PlanConfig(mode="async", steps=4, concurrent_groups=4, max_staleness=1))
    assert result.cold_acquires > 0 and result.acquire_wait_s > 0


def test_a_cancelled_cold_start_becomes_a_spare_and_refills_stop_at_the_target():
    import random

    from envhub.trainer.plan.model import PoolModel
    from envhub.trainer.plan.pools import SandboxPools

    pools = SandboxPools(PoolModel(spares=2, create_s=(1.0,)), hosts=2, rng=random.Random(0))
    assert pools.take(0) and pools.refills(0) == 1 and pools.refills(0) == 0  # one under way already
    assert pools.take(0) and not pools.take(0) and pools.cold_acquires == 1
    assert pools.refills(0) == 1  # one spare short (the other creation is still under way)
    pools.orphaned(0)  # the cold start's episode was cancelled: it will be a spare
    for _ in range(3):
        pools.created(0)
    assert pools.take(0) and pools.take(0) and pools.take(0) and not pools.take(0)
    assert pools.take(1) and pools.cold_acquires == 2  # hosts have their own pools


def test_sweeps_answer_the_planner_questions_on_an_env_bound_pipeline():
    from envhub.trainer.plan.sweeps import all_sweeps, redundancy, sweep_tables

    model = pipeline(groups=groups_with_spread(), env_s=1.0, learn_s=0.2, per_call=0.5)  # env calls contend
    sweeps = all_sweeps(model, PlanConfig(mode="async", steps=4, max_staleness=1), trials=1)
    speedup = sweeps["scaling"]["speedup"]
    assert speedup["1"]["1"] == 1.0 and speedup["1"]["16"] > 1.5  # env hosts relieve a contended host
    assert speedup["8"]["16"] > speedup["1"]["16"]
    assert sweeps["scaling"]["env_hosts_needed"]["1"]["env_hosts"] > 1
    by_bound = sweeps["staleness"]["by_bound"]
    assert by_bound["0"]["speedup"] == 1.0 and by_bound["0"]["mean_staleness"] == 0
    assert sweeps["staleness"]["smallest_bound_keeping_speedup"] >= 1
    assert set(sweeps["redundancy"]) == {"recorded_scale", "engines_to_spare"}
    assert "env hosts needed" in sweep_tables(sweeps)
    # with capacity to spare and no contention, spare episodes cut the long tail of a sync step
    uncontended = pipeline(groups=groups_with_spread(), learn_s=0.2)
    spare = PlanConfig(mode="sync", steps=6, engines=4, env_hosts=8, resample="episode")
    rows = redundancy(uncontended, spare, (0, 2), trials=2)
    assert rows["2"]["group_s"]["p90"] < rows["0"]["group_s"]["p90"]
    assert rows["2"]["episodes_per_s"] > rows["0"]["episodes_per_s"]


def test_bad_settings_are_refused():
    model = pipeline()
    for bad in ({"engines": 0}, {"steps": 0}, {"redundancy": -1}, {"mode": "both"}, {"steps": 10**7}):
        with pytest.raises(ConfigError):
            simulate(model, PlanConfig(**bad))
    with pytest.raises(ConfigError, match="max-staleness 0.1 x 4 groups a step rounds down to 0 groups"):
        simulate(model, PlanConfig(max_staleness=0.1, groups_per_step=4))
    simulate(model, PlanConfig(mode="sync", max_staleness=0.1, groups_per_step=4))  # sync uses no bound


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A real two-step sync run of the latency benchmark env (tiny model), its directory kept."""
    pytest.importorskip("envhub.trainer.engines.embedded.engine")
    from envhub.trainer import bench

    keep = tmp_path_factory.mktemp("plan-run")
    bench.register_workloads()
    asyncio.run(bench.measure("sync", 2, workload="latency", keep=keep))
    return keep / "sync"


def test_a_real_run_record_reads_back_and_replays(tiny_run):
    record = read_run(tiny_run)
    assert len(record.steps) == 2 and record.mode == "sync"
    # a sync run trains every group it starts, whole, two a step: none is started after the last step
    groups = sorted((g.trained_at, g.outcome, len(g.episodes)) for g in record.groups)
    assert groups == [(1, "trained", 4)] * 2 + [(2, "trained", 4)] * 2
    assert 0 < record.startup_s < record.wall_s
    for e in record.episodes:
        kinds = [s.kind for s in e.spans]
        assert kinds[0] == "reset" and kinds.count("generate") == len(e.turns) and kinds[-1] == "final"
        assert all(a.end <= b.start + 1e-3 for a, b in zip(e.spans, e.spans[1:]))  # stages in order, no overlap
    # each row's CPU accounting: counters that only grow; an episode's CPU work from the first row to the last
    assert len(record.cpu) == 2 and record.cpu[0].machine_s <= record.cpu[1].machine_s and record.cpu[0].cpus >= 1
    model = fit_model(record)
    assert model.shared == "all" and model.engine.t0 > 0 and model.learner.step_s(1000) > 0
    assert model.cpu is not None and 0 < model.cpu.trainer_s <= model.cpu.machine_s + 0.05
    report = plan_report(record, model, record_config(record, mode="async"), trials=2)
    assert report["run"]["episodes_per_s"] == measured(record)["episodes_per_s"] > 0
    assert report["prediction"]["episodes_per_s"] > 0 and report["replay"]["mean_staleness"] == 0


def test_a_corrupted_record_is_refused_with_the_field_named(tiny_run, tmp_path):
    import shutil

    records_only = shutil.ignore_patterns("checkpoints", "latest", "tb", "*.png")

    for field_name, value in (("generate_s", float("nan")), ("env_s", -3.0), ("at", "soon")):
        run = tmp_path / field_name
        shutil.copytree(tiny_run, run, ignore=records_only)
        rows = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
        turn = next(t for t in rows[0]["log"] if t.get("kind") == "turn")
        turn[field_name] = value
        (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(ConfigError, match=f"turn.{field_name} = "):
            read_run(run)
    metrics = tmp_path / "metrics"
    shutil.copytree(tiny_run, metrics, ignore=records_only)
    rows = [json.loads(line) for line in (metrics / "metrics.jsonl").read_text().splitlines()]
    next(r for r in reversed(rows) if "step_s" in r)["step_s"] = float("inf")
    (metrics / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="wall-clock times"):
        read_run(metrics)


def test_cli_plan_writes_json_and_refuses_bad_input(tiny_run, tmp_path):
    def plan(*args):
        return subprocess.run(
            [sys.executable, "-m", "envhub.cli.main", "plan", *map(str, args)], capture_output=True, text=True
        )

    out = tmp_path / "plan.json"
    done = plan(tiny_run, "--mode", "async", "--engines", "2", "--trials", "2", "--out", out)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["config"]["engines"] == 2 and report["config"]["mode"] == "async"
    assert "recorded (sync)" in done.stdout and "bounds" in done.stdout
    missing = plan(tmp_path / "nowhere")
    assert missing.returncode == 2 and "not a directory" in missing.stderr
    (tmp_path / "empty").mkdir()
    assert "no config.json" in plan(tmp_path / "empty").stderr
    bad = plan(tiny_run, "--engines", "0")
    assert bad.returncode == 2 and "engines must be at least 1" in bad.stderr


def test_a_fractional_staleness_bound_sits_between_sync_and_one_step():
    # an engine whose step costs per row (throughput-bound): half a batch generates in half the time
    bound = pipeline(gen_steps=10, step_s=0.0, per_row=0.05, env_s=0.0, learn_s=2.0)
    one = PlanConfig(mode="async", max_staleness=1, steps=20, groups_per_step=2, concurrent_groups=8)
    results = {s: simulate(bound, replace(one, max_staleness=s)) for s in (0.5, 1)}
    sync = simulate(bound, replace(one, mode="sync"))
    assert sync.mean_staleness == 0 < results[0.5].mean_staleness < results[1].mean_staleness
    assert results[0.5].episodes_per_s > 1.2 * sync.episodes_per_s and results[1].episodes_per_s > sync.episodes_per_s
    # an engine that batches for free: the half step started early finishes no sooner than the whole, so the
    # step waits for the groups started after the publish, as in sync; only a whole step ahead overlaps
    free = pipeline(gen_steps=10, step_s=0.1, env_s=1.0, learn_s=3.0)
    half, sync = simulate(free, replace(one, max_staleness=0.5)), simulate(free, replace(one, mode="sync"))
    assert half.episodes_per_s == pytest.approx(sync.episodes_per_s)
    assert simulate(free, one).episodes_per_s > sync.episodes_per_s
