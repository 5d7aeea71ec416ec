"""Fail fast, never hang: bad task kwargs stop `envhub train` before training; tasks that keep failing stop the run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import envhub
from envhub.envinfo import check_kwargs
from envhub.errors import ConfigError, EnvNotFound
from envhub.trainer.config import TaskConfig, config_from_dict
from envhub.trainer.rollout.preflight import check_task
from envhub.trainer.run.errors import TaskErrors, TaskFailing
from envhub.trainer.trajectory import Trajectory

pytest.importorskip("envhub.trainer.engines.embedded.engine")

REPO = Path(__file__).resolve().parents[3]


class BreaksOnStep(envhub.AgentEnv):
    """Resets fine, then every step raises (a bug that only shows once episodes run)."""

    def __init__(self, depth: int = 1) -> None:
        self.depth = depth

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        return "Say anything.", info

    def step(self, action):
        raise RuntimeError(f"the env's step is broken (depth {self.depth})")


class BreaksOnReset(BreaksOnStep):
    def reset(self, *, seed=None, options=None):
        raise ValueError(f"no level with depth {self.depth:d}")


envhub.register("BreaksOnStep-v0", BreaksOnStep)
envhub.register("BreaksOnReset-v0", BreaksOnReset)


def test_ci_tiny_with_a_kwarg_typo_fails_in_seconds_naming_task_kwarg_and_fix(tmp_path):
    config = (REPO / "configs" / "ci-tiny.yaml").read_text().replace("{letters: aeiou}", "{leters: aeiou}")
    assert "leters" in config
    path = tmp_path / "bad.yaml"
    path.write_text(config)
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", "train", str(path), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )  # the old behaviour hung here
    assert result.returncode == 2
    first = next(line for line in result.stderr.splitlines() if line.startswith("envhub: error:"))
    assert "Letters-v0" in first and "'leters'" in first and "did you mean 'letters'?" in first
    assert "Traceback" not in result.stderr and not out.exists()


async def test_kwargs_are_checked_against_the_constructor_with_suggestions():
    check_kwargs("FrozenLake-v0", {"size": 5, "slippery": True})
    with pytest.raises(ConfigError) as caught:
        await check_task(TaskConfig(env="envhub/FrozenLake-v0", kwargs={"slipery": True}))
    assert str(caught.value.args[0]) == "task FrozenLake-v0: unknown kwarg 'slipery'; did you mean 'slippery'?"
    assert "size, hole_fraction, slippery, spaced, neighbours, random_ends, render_mode" in caught.value.hint
    with pytest.raises(EnvNotFound, match="FrozenLake-v0"):
        await check_task(TaskConfig(env="FrozenLak-v0"))


async def test_check_task_names_the_task_when_building_or_resetting_fails():
    with pytest.raises(
        ConfigError,
        match=r"task FrozenLake-v0: cannot build the env with kwargs \{\"size\": 1\}: ValueError: FrozenLake size",
    ):
        await check_task(TaskConfig(env="FrozenLake-v0", kwargs={"size": 1}))
    with pytest.raises(ConfigError, match="task BreaksOnReset-v0: reset failed .*ValueError: no level with depth 3"):
        await check_task(TaskConfig(env="BreaksOnReset-v0", kwargs={"depth": 3}))
    await check_task(TaskConfig(env="BreaksOnStep-v0"))  # its bug only shows in episodes: caught by TaskErrors


async def test_a_task_whose_episodes_keep_failing_stops_the_run_with_its_error(tmp_path):
    from envhub.trainer.train import Trainer

    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Letters-v0"}, {"env": "BreaksOnStep-v0", "kwargs": {"depth": 7}}],
            "rollout": {"group_size": 2, "max_new_tokens": 2, "max_turns": 1, "max_task_errors": 4},
            "algorithm": {"groups_per_step": 2},
            "budget": {"steps": 50},
            "out_dir": str(tmp_path),
        }
    )
    with pytest.raises(TaskFailing) as caught:
        await Trainer(config).run()
    message = str(caught.value)
    assert message.startswith("task BreaksOnStep-v0: ") and "in a row failed (at step)" in message
    assert "RuntimeError: the env's step is broken (depth 7)" in message
    logged = [json.loads(line) for line in (tmp_path / "episode_errors.jsonl").read_text().splitlines()]
    assert len(logged) >= 4 and {e["task"] for e in logged} == {"BreaksOnStep-v0"}
    assert all(e["stage"] == "step" and "depth 7" in e["error"] and isinstance(e["seed"], int) for e in logged)


def episode(task: str, seed: int, error: str = "", stage: str = "") -> Trajectory:
    """A finished episode as a rollout source reports it (an error one when `error` is given)."""
    info = {"error": error, "error_stage": stage} if error else {}
    finish = "error" if error else "terminated"
    return Trajectory([1], [0], [0.0], [-1], 0.0, task, "g", seed, 0, finish, env_info=info)


def test_counts_reset_after_a_success_and_zero_never_stops():
    errors = TaskErrors(max_in_a_row=2)
    errors.observe(episode("A-v0", 1, "RuntimeError: boom", "reset"))
    errors.observe(episode("A-v0", 9))
    errors.observe(episode("A-v0", 2, "RuntimeError: boom", "reset"))
    errors.raise_if_failing()
    assert errors.metrics() == {"episode_errors": {"A-v0": 2}, "episode_error": {"A-v0": "RuntimeError: boom"}}
    errors.observe(episode("A-v0", 3, "RuntimeError: bang", "step"))
    with pytest.raises(TaskFailing, match="task A-v0: 2 episodes in a row failed .*RuntimeError: bang"):
        errors.raise_if_failing()
    never = TaskErrors(max_in_a_row=0)
    for seed in range(100):
        never.observe(episode("A-v0", seed, "RuntimeError: x", "step"))
    never.raise_if_failing()


def test_engine_errors_are_counted_apart_from_the_task():
    errors = TaskErrors(max_in_a_row=1)
    errors.observe(episode("A-v0", 1, "EngineError: connection refused", "generate"))
    errors.raise_if_failing()  # the engine failing is not the env's fault
    assert errors.metrics() == {"engine_errors": 1}


def test_an_engine_failing_every_episode_for_a_minute_stops_the_run():
    from envhub.errors import EngineError

    now = [0.0]
    errors = TaskErrors(max_in_a_row=3, engine_down_s=60.0, clock=lambda: now[0])
    refused = "EngineError: vLLM at http://127.0.0.1:9/inference/v1/generate failed: connection refused"
    for seed in range(5):
        errors.observe(episode("A-v0", seed, refused, "generate"))
    errors.raise_if_failing()  # five failures within a moment: a hiccup, not yet a dead engine
    now[0] = 61.0
    errors.observe(episode("A-v0", 5, refused, "generate"))
    with pytest.raises(EngineError, match="failed every episode for 61 s \\(6 in a row\\); last error: .*refused"):
        errors.raise_if_failing()
    errors.observe(episode("A-v0", 6))  # one episode that ran: the engine works again
    errors.raise_if_failing()


def test_ctrl_c_before_the_first_step_names_no_file_that_was_never_written(tmp_path):
    import signal
    import time

    config = tmp_path / "c.yaml"
    out = tmp_path / "run"
    config.write_text(
        "model: {name: tiny}\ntasks: [{env: Letters-v0}]\nrollout: {group_size: 2, max_new_tokens: 2, max_turns: 1}\n"
        f"budget: {{steps: 1000}}\nout_dir: {out}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub.cli.main", "train", str(config)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "config.json").exists():  # written once the run (and its Ctrl-C handler) has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    if not (out / "metrics.jsonl").exists():  # (a very fast machine may finish a step first)
        assert "no step finished, nothing saved" in stdout and "metrics" not in stdout, stdout
        assert "interrupted before the first step" in stderr and not (out / "checkpoints").exists()
    for named in stdout.split("; ")[1:]:
        if " /" in named:
            assert Path(named.split(" ", 1)[1].strip()).exists(), named


def test_a_harness_task_is_checked_before_training(monkeypatch, tmp_path):
    from envhub.trainer.harness import builtin
    from envhub.trainer.rollout.preflight import check_harness

    with pytest.raises(ConfigError, match="TicTacToe-v0 is multi-agent .*TicTacToe-SelfPlay-v0"):
        check_harness(TaskConfig(env="TicTacToe-v0", harness="python3 agent.py"))
    monkeypatch.setattr(builtin, "overlay_dir", lambda: tmp_path)  # the built-ins' packages are not installed
    with pytest.raises(ConfigError, match="harness 'openai-agents': .*lacks 'agents' .*make install") as err:
        check_harness(TaskConfig(env="Letters-v0", harness="openai-agents"))
    assert "\n" not in str(err.value)


def test_a_harness_that_keeps_failing_stops_the_run_as_its_task_s_error():
    errors = TaskErrors(max_in_a_row=2)
    info = {"error": "the harness exited with status 3; stderr tail:\nTraceback", "error_stage": "harness"}
    for _ in range(2):
        errors.observe(Trajectory([], [], [], [], 0.0, "Letters-v0", "g", 0, 0, "error", dict(info)))
    with pytest.raises(TaskFailing, match="task Letters-v0: 2 episodes in a row failed \\(at harness\\)"):
        errors.raise_if_failing()
    assert errors.engine_errors == 0  # a program's crash is not the engine's
