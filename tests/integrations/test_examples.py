"""The examples/ scripts run as a user would run them."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name, *args, cwd):
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_id", "extra"),
    [("FrozenLake-v0", ["--kwargs", json.dumps({"size": 3}), "--max-turns", "2"]), ("Letters-v0", [])],
)
def test_trl_grpo_trains_a_tool_env_and_a_text_env(tmp_path, env_id, extra):
    pytest.importorskip("trl")
    small = ["--group", 2, "--batch", 2, "--seeds", 4, "--max-completion-length", 64, "--threads", 1]
    done = run_example("trl_grpo.py", env_id, "--max-steps", 1, *small, *extra, "--out", tmp_path / "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    reward = float(re.search(r"step 1: reward (\S+)", done.stderr).group(1))
    # as the example's docstring says: the random tiny model earns part of Letters' dense reward, and never calls
    # FrozenLake's tools (the plumbing works, the reward stays 0)
    assert reward > 0 if env_id == "Letters-v0" else reward == 0.0


def test_verl_agent_loop_writes_the_run_and_prints_the_command(tmp_path):
    (tmp_path / "shout_env.py").write_text(
        "import envhub\n\n\nclass Shout(envhub.AgentEnv):\n"
        "    def reset(self, *, seed=None, options=None):\n        return 'say hi', super().reset(seed=seed)[1]\n\n"
        "    def step(self, action):\n        return action.upper(), 1.0, True, False, {}\n\n\n"
        "def register_envs():\n    envhub.register('VerlShout-v0', Shout)\n"
    )
    done = run_example(
        "verl_agent_loop.py", "FrozenLake-v0", "VerlShout-v0", "--import", "shout_env.py", "--seeds", 3, "--out", "d",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = tmp_path / "d"
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert [r["extra_info"]["env_id"] for r in rows] == ["FrozenLake-v0"] * 3 + ["VerlShout-v0"] * 3
    assert len(pq.read_table(out / "val.parquet")) == 64
    (loop,) = yaml.safe_load((out / "agent_loops.yaml").read_text())
    assert loop["imports"] == [str(tmp_path / "shout_env.py")]  # verl's workers import the user's envs too
    assert "python -m verl.trainer.main_ppo" in done.stdout
    assert f"agent_loop_config_path={out}/agent_loops.yaml" in done.stdout


def test_skyrl_gym_writes_the_dataset_and_says_how_to_train(tmp_path):
    done = run_example("skyrl_gym.py", "Letters-v0", "--seeds", 2, "--out", "d", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert pq.read_table(tmp_path / "d" / "train.parquet").column("env_class").to_pylist() == ["envhub/Letters-v0"] * 2
    assert "--train" in done.stdout
    bad = run_example("skyrl_gym.py", "Letterz-v0", "--out", "d", cwd=tmp_path)
    assert bad.returncode == 1 and bad.stderr.startswith("error: unknown environment 'Letterz-v0'")
    assert "did you mean Letters-v0" in bad.stderr and "Traceback" not in bad.stderr
