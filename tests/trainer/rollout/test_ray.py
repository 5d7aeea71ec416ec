"""Training with env workers as Ray actors on a local Ray instance: same trajectories, valid checkpoint, actor deaths
retried."""

import asyncio
import json
import os
import textwrap
from pathlib import Path

import pytest

import envhub
from envhub.trainer.config import config_from_dict
from envhub.trainer.learner.checkpoint import latest_checkpoint
from envhub.trainer.train import Trainer

ray = pytest.importorskip("ray")
pytest.importorskip("envhub.trainer.engines.embedded.engine")
from envhub.trainer.bench import BENCH_ENV, SlowLettersEnv  # noqa: E402
from envhub.trainer.rollout.ray_workers import RayOptions  # noqa: E402

# one xdist unit: the module's tests run in one go on one worker, so its module-scoped Ray cluster is made once
# (handed out one by one, they interleave with other modules' tests and pytest tears it down between them)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def config(out_dir, env="Letters-v0", steps=2, kwargs=None, **rollout):
    return config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": env, "kwargs": kwargs or {}}],
            "rollout": {"group_size": 4, "max_new_tokens": 4, "max_turns": 1, **rollout},
            "algorithm": {"groups_per_step": 2, "lr": 0.01, "mode": "sync", "filter_zero_variance": False},
            "budget": {"steps": steps, "checkpoint_every": 10},
            "out_dir": str(out_dir),
        }
    )


async def test_ray_run_matches_in_process_trajectories_and_checkpoint(local_ray, tmp_path):
    local = await Trainer(config(tmp_path / "local")).run()
    trainer = Trainer(config(tmp_path / "ray"), ray=RayOptions(workers=2))
    remote = await trainer.run()
    assert remote.last_step == local.last_step == 2
    local_q, ray_q = (latest_checkpoint(tmp_path / d).state["queue"] for d in ("local", "ray"))
    assert ray_q["consumed"] == local_q["consumed"] == 4 and ray_q["failed"] == 0
    assert trainer.rollouts.episodes_finished >= 16 and trainer.rollouts.episodes_retried == 0
    assert [r["turns"] for r in remote.history] == [r["turns"] for r in local.history]
    from transformers import AutoModelForCausalLM

    ckpt = latest_checkpoint(tmp_path / "ray")
    assert ckpt.step == 2 and AutoModelForCausalLM.from_pretrained(ckpt.path).num_parameters() > 0
    assert trainer.rollouts.engine_urls.startswith("http://127.0.0.1:")  # the driver served its EmbeddedEngine


async def test_killing_an_env_worker_mid_run_loses_no_finished_trajectory(local_ray, tmp_path):
    if BENCH_ENV not in {s.id for s in envhub.list_envs()}:
        envhub.register(BENCH_ENV, SlowLettersEnv)
    trainer = Trainer(
        config(tmp_path, env=BENCH_ENV, steps=3, kwargs={"median_s": 0.4, "sigma": 0.2}, max_turns=3),
        ray=RayOptions(workers=2, episodes_per_worker=4),
    )
    run = asyncio.create_task(trainer.run())
    # kill worker 0 once some episodes are back and some are running on it
    while trainer.rollouts is None or trainer.rollouts.episodes_finished < 2 or trainer.rollouts.load[0] == 0:
        assert not run.done(), run.result()
        await asyncio.sleep(0.05)
    source = trainer.rollouts
    finished_before = source.episodes_finished
    victim = source.actors[0]
    ray.kill(victim, no_restart=True)
    result = await asyncio.wait_for(run, timeout=120)
    assert result.last_step == 3
    assert source.episodes_retried >= 1 and source.actors_restarted == 1
    assert source.actors[0] is not victim  # its slot got a fresh actor
    queue = latest_checkpoint(tmp_path).state["queue"]
    # no group lost an episode: every started group that finished came back whole
    assert queue["failed"] == 0 and queue["consumed"] == 6
    assert source.episodes_finished >= finished_before + 1


async def test_env_workers_pass_the_env_servers_token(local_ray, tmp_path, monkeypatch):
    from tests.conftest import start_server

    running, stop = start_server(tokens=["ray-secret"])
    monkeypatch.setenv("ENVHUB_TOKEN", "ray-secret")  # set after ray.init: only runtime_env can bring it to the actors
    try:
        cfg = config_from_dict(
            {
                "model": {"name": "tiny"},
                "tasks": [{"env": "Letters-v0", "remote": running.url}],
                "rollout": {"group_size": 2, "max_new_tokens": 4, "max_turns": 1},
                "algorithm": {"groups_per_step": 1, "lr": 0.01, "mode": "sync", "filter_zero_variance": False},
                "budget": {"steps": 1, "checkpoint_every": 10},
                "out_dir": str(tmp_path),
            }
        )
        # without the token every remote episode fails with 401 and the run never finishes a step
        result = await asyncio.wait_for(Trainer(cfg, ray=RayOptions(workers=1)).run(), 180)
        assert result.last_step == 1
    finally:
        stop()


async def test_a_task_failing_on_every_ray_worker_stops_the_run_naming_task_and_error(local_ray, tmp_path, monkeypatch):
    from envhub.trainer.run.errors import TaskFailing
    from tests.conftest import start_server

    running, stop = start_server(tokens=["ray-secret"])
    monkeypatch.delenv("ENVHUB_TOKEN", raising=False)  # the actors have no token: every episode gets 401 at reset
    try:
        cfg = config_from_dict(
            {
                "model": {"name": "tiny"},
                "tasks": [{"env": "Letters-v0", "remote": running.url}],
                "rollout": {"group_size": 2, "max_new_tokens": 4, "max_turns": 1, "max_task_errors": 4},
                "algorithm": {"groups_per_step": 1, "lr": 0.01, "mode": "sync"},
                "budget": {"steps": 1, "checkpoint_every": 10},
                "out_dir": str(tmp_path),
            }
        )
        with pytest.raises(TaskFailing) as caught:
            await asyncio.wait_for(Trainer(cfg, ray=RayOptions(workers=1)).run(), 180)
        assert str(caught.value).startswith("task Letters-v0: ") and "(at reset)" in str(caught.value)
        assert "401" in str(caught.value) or "token" in str(caught.value)
        assert (tmp_path / "episode_errors.jsonl").read_text().count('"stage": "reset"') >= 4
    finally:
        stop()


async def test_env_workers_import_the_configs_imports(local_ray, tmp_path):
    # an env that exists only in a file the driver imported: the workers must import the same file to play it
    (tmp_path / "pid_env.py").write_text(
        textwrap.dedent(
            '''
            import os

            import envhub


            class Pid(envhub.AgentEnv):
                def reset(self, *, seed=None, options=None):
                    _, info = super().reset(seed=seed)
                    return "go", {**info, "pid": os.getpid()}

                def step(self, action):
                    return "done", 1.0, True, False, {}


            def register_envs():
                envhub.register("RayPidImport-v0", Pid)
            '''
        )
    )
    cfg = config(tmp_path / "run", env="RayPidImport-v0", steps=1)
    cfg.imports = [str(tmp_path / "pid_env.py")]
    trainer = Trainer(cfg, ray=RayOptions(workers=1))
    result = await asyncio.wait_for(trainer.run(), 180)
    assert result.last_step == 1 and trainer.rollouts.episodes_finished >= 4
    records = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    pids = {r["env_info"]["pid"] for r in records if r["kind"] == "episode"}
    assert pids and os.getpid() not in pids  # played in the worker process, not here


async def test_a_ray_run_reaches_a_kind_defined_outside_envhub(local_ray, tmp_path):
    # tests/trainer/engines/counting_kind.py registers `engine.kind: counting`; nothing in envhub names it
    from envhub.user_modules import load_user_module

    counting = str(Path(__file__).parents[1] / "engines" / "counting_kind.py")
    module = load_user_module(counting)
    before = module.CountingEngine.generated
    cfg = config(tmp_path / "run", steps=1)
    cfg.engine.kind, cfg.imports = "counting", [counting]
    trainer = Trainer(cfg, ray=RayOptions(workers=1))
    result = await asyncio.wait_for(trainer.run(), 180)
    assert result.last_step == 1 and trainer.rollouts.episodes_finished >= 8
    assert module.CountingEngine.generated - before >= 8  # every episode's turn, served from here to the worker
