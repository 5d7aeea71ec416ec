"""envhub envs in verl's agent loop: the dataset and YAML verl reads, and verl's own AgentLoopWorker driving
`EnvhubAgentLoop` (in a subprocess: verl and the hydra/omegaconf/antlr versions it pins live in their own folder,
`make install` puts them in .venv/verl-overlay, so that this venv's packages stay as they are)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

import envhub
from envhub.integrations.verl import LOOP_TARGET, write_agent_loop_config, write_dataset

OVERLAY = Path(sys.prefix) / "verl-overlay"
HERE = Path(__file__).resolve().parent


def test_the_dataset_is_in_verls_layout(tmp_path):
    path = write_dataset(tmp_path / "train.parquet", ["FrozenLake-v0", "Wordle-v0"], seeds=[5, 6])
    rows = pq.read_table(path).to_pylist()
    assert [(r["extra_info"]["env_id"], r["extra_info"]["seed"]) for r in rows] == [
        ("FrozenLake-v0", 5),
        ("FrozenLake-v0", 6),
        ("Wordle-v0", 5),
        ("Wordle-v0", 6),
    ]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2, 3]
    first = rows[0]
    assert first["agent_name"] == "envhub" and first["data_source"] == "envhub/FrozenLake-v0"
    assert first["prompt"] == [{"role": "system", "content": envhub.make("FrozenLake-v0").unwrapped.system_prompt}]


def test_the_agent_loop_yaml_names_the_loop_class(tmp_path):
    path = write_agent_loop_config(tmp_path / "loops.yaml", max_turns=3, env_kwargs={"size": 3}, imports=["mine.py"])
    assert yaml.safe_load(path.read_text()) == [
        {"name": "envhub", "_target_": LOOP_TARGET, "max_turns": 3, "env_kwargs": {"size": 3}, "imports": ["mine.py"]}
    ]
    assert LOOP_TARGET == "envhub.integrations.verl.EnvhubAgentLoop"


def test_without_verl_the_loop_class_names_the_install_command():
    try:
        import verl  # noqa: F401

        pytest.skip("verl is importable in this venv")
    except ImportError:
        pass
    with pytest.raises(envhub.EnvhubError, match="verl's agent loop cannot be imported") as err:
        from envhub.integrations.verl import EnvhubAgentLoop  # noqa: F401
    assert "pip install 'envhub[verl]'" in err.value.hint


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory):
    if not (OVERLAY / "verl").is_dir():
        pytest.skip(f"verl is not installed in {OVERLAY} (make install puts it there)")
    workdir = tmp_path_factory.mktemp("verl")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(OVERLAY), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(HERE / "verl_run.py"), str(workdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_verls_worker_pads_the_envs_episodes_and_takes_their_reward(verl_run):
    assert verl_run["verl_version"].startswith("0.9")
    assert verl_run["overrides"]["adv_estimator"] == "grpo" and verl_run["overrides"]["n"] == 4  # keys verl knows
    assert verl_run["overrides"]["loops"].endswith("agent_loops.yaml")
    for run in (verl_run["engine"], verl_run["solver"]):
        assert {"prompts", "responses", "response_mask", "rm_scores", "rollout_log_probs"} <= set(run["keys"])
        assert run["shapes"]["responses"] == [4, 512] and run["shapes"]["input_ids"] == [4, 1536]
        assert run["seeds"] == [3, 3, 8, 8]  # RLHFDataset read the parquet; each seed repeated for its group
        assert run["env_ids"] == ["FrozenLake-v0"] * 4
        assert run["logprobs_on_env_tokens"] == 0.0  # env tokens carry no logprob
        assert [sum(s) for s in run["turn_scores"]] == run["rm_scores"]  # the env's return is verl's score
        assert len({c["request_id"] for c in run["calls"]}) == 4  # one sticky request id per episode
    solver = verl_run["solver"]
    assert solver["rm_scores"] == [1.0] * 4 and solver["finish_reasons"] == ["terminated"] * 4
    assert solver["model_text"].count("<tool_call>") == solver["num_turns"][0] // 2 >= 2
    assert set(solver["logprobs_on_model_tokens"]) == {-0.25}  # the server's logprobs, where the model wrote
    assert "<tools>" in solver["prompt_text"] and '"name": "move"' in solver["prompt_text"]
    engine = verl_run["engine"]  # the tiny random Llama through envhub's EmbeddedEngine: real samples, real logprobs
    assert all(c["max_new_tokens"] <= 48 for c in engine["calls"]) and len(engine["calls"]) >= 8
    assert all(lp < 0 for lp in engine["logprobs_on_model_tokens"])
    assert all(0 < n < 512 for n in engine["model_tokens"]) and set(engine["finish_reasons"]) <= {
        "max_turns",
        "max_tokens",
        "terminated",
        "truncated",
    }
