"""envhub envs in SkyRL: skyrl_gym's own make/init/step on EnvhubTextEnv, and SkyRL's generator playing them (in a
subprocess: the `skyrl` trainer package, installed without its GPU dependencies, lives in .venv/skyrl-overlay)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import envhub
from envhub.integrations.skyrl import register, write_dataset
from tests.integrations.lake import lake_move, move_call

skyrl_gym = pytest.importorskip("skyrl_gym")
OVERLAY = Path(sys.prefix) / "skyrl-overlay"
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def registered():
    return register(["FrozenLake-v0", "Wordle-v0", "Letters-v0"], env_kwargs={"FrozenLake-v0": {"size": 3}})


def test_register_names_each_env_and_a_generic_one(registered):
    assert registered == ["envhub", "envhub/FrozenLake-v0", "envhub/Wordle-v0", "envhub/Letters-v0"]
    assert register(["FrozenLake-v0"], env_kwargs={"FrozenLake-v0": {"size": 3}})  # again: replaces, no error
    assert register(["Letters-v0"], prefix="") == ["Letters-v0"]  # no prefix: no generic id named ""


def test_skyrl_gym_plays_a_tool_env_to_its_reward():
    env = skyrl_gym.make("envhub/FrozenLake-v0", env_config={}, extras={"seed": 4, "max_turns": 10})
    messages, meta = env.init([{"role": "user", "content": ""}])
    assert meta == {"env_id": "FrozenLake-v0"} and [m["role"] for m in messages] == ["system", "user"]
    assert '"name": "move"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]  # schema in text
    conversation = "\n".join(m["content"] for m in messages)
    while True:
        out = env.step(move_call(lake_move(conversation)))
        if out["done"]:
            break
        assert out["reward"] == 0.0 and [m["role"] for m in out["observations"]] == ["user"]
        conversation += "\n" + out["observations"][0]["content"]
    assert out["reward"] == 1.0 and out["observations"] == [] and out["metadata"]["terminated"]
    assert env.get_metrics() == {"return": 1.0, "turns": env.turns, "terminated": 1.0}
    env.close()


def test_max_turns_from_the_generator_ends_the_episode():
    env = skyrl_gym.make("envhub/Wordle-v0", env_config={}, extras={"seed": 1, "max_turns": 2})
    env.init([])
    first = env.step('<tool_call>{"name": "guess", "arguments": {"word": "crane"}}</tool_call>')
    second = env.step('<tool_call>{"name": "guess", "arguments": {"word": "slate"}}</tool_call>')
    assert not first["done"] and second["done"] and env.get_metrics()["terminated"] == 0.0
    env.close()


def test_the_generic_id_reads_the_env_from_the_row():
    env = skyrl_gym.make("envhub", env_config={}, extras={"env_id": "Letters-v0", "seed": 0, "max_turns": 1})
    messages, _ = env.init([])
    assert "letters" in messages[-1]["content"]
    assert env.step("aeiou")["reward"] == 1.0
    env.close()
    with pytest.raises(envhub.ConfigError, match="no envhub env id"):
        skyrl_gym.make("envhub", env_config={}, extras={"seed": 0})
    with pytest.raises(envhub.EnvNotFound):
        skyrl_gym.make("envhub", env_config={}, extras={"env_id": "NoSuch-v0"})


def test_a_clashing_skyrl_id_and_imports(tmp_path):
    skyrl_gym.register(id="mine/Letters-v0", entry_point="skyrl_gym.envs.base_text_env:BaseTextEnv")
    with pytest.raises(envhub.ConfigError, match="already has an env 'mine/Letters-v0'"):
        register(["Letters-v0"], prefix="mine/")
    (tmp_path / "echo_env.py").write_text(
        "import envhub\n\n\nclass Echo(envhub.AgentEnv):\n"
        "    def reset(self, *, seed=None, options=None):\n        return 'say hi', super().reset(seed=seed)[1]\n\n"
        "    def step(self, action):\n        return action, float(action == 'hi'), True, False, {}\n\n\n"
        "def register_envs():\n    envhub.register('SkyEcho-v0', Echo)\n"
    )
    assert "envhub/SkyEcho-v0" in register(["SkyEcho-v0"], imports=[str(tmp_path / "echo_env.py")])
    env = skyrl_gym.make("envhub/SkyEcho-v0", env_config={}, extras={"seed": 0})
    env.init([])
    assert env.step("hi")["reward"] == 1.0


def test_the_dataset_is_in_skyrls_layout(tmp_path):
    rows = pq.read_table(write_dataset(tmp_path / "d.parquet", ["Letters-v0", "Wordle-v0"], seeds=[1, 2])).to_pylist()
    assert [(r["env_class"], r["seed"]) for r in rows] == [
        ("envhub/Letters-v0", 1),
        ("envhub/Letters-v0", 2),
        ("envhub/Wordle-v0", 1),
        ("envhub/Wordle-v0", 2),
    ]
    assert rows[0]["prompt"] == [{"role": "user", "content": ""}] and rows[0]["data_source"] == "envhub/Letters-v0"


@pytest.mark.slow
def test_skyrls_generator_plays_envhub_envs(tmp_path):
    if not (OVERLAY / "skyrl").is_dir():
        pytest.skip(f"skyrl is not installed in {OVERLAY} (make install puts it there)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(OVERLAY), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, str(HERE / "skyrl_run.py"), str(tmp_path)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["config"] == {  # train_overrides parsed by SkyRL's own config class
        "train_data": [str(tmp_path / "train.parquet")],
        "max_turns": 6,
        "group_size": 4,
        "env_class": "envhub",
    }
    assert result["sessions_finished"] == [4, 4]  # SkyRL releases each trajectory's session
    engine = result["engine"]  # the tiny random Llama via envhub's EmbeddedEngine
    assert [(r["env_class"], r["seed"]) for r in engine] == [
        ("envhub/FrozenLake-v0", 2),
        ("envhub/FrozenLake-v0", 9),
        ("envhub/Letters-v0", 2),
        ("envhub/Letters-v0", 9),
    ]
    for row in engine:
        assert row["logprobs"] == row["response_tokens"] == len(row["loss_mask"])
        assert 0 < sum(row["loss_mask"]) <= row["response_tokens"]
    letters = engine[2]  # one turn: the whole response is the model's, the reward at its last token
    assert sum(letters["loss_mask"]) == letters["response_tokens"] and letters["env_metrics"]["turns"] == 1
    assert list(letters["rewards"]) in ([], [str(letters["response_tokens"] - 1)])
    for row in result["solver"]:  # FrozenLake solved: 1.0 at the last token, tool schemas in the system message
        assert row["rewards"] == {str(row["response_tokens"] - 1): 1.0} and row["env_metrics"]["return"] == 1.0
        assert '"name": "move"' in row["prompt"] and "Their JSON schemas" in row["prompt"]
