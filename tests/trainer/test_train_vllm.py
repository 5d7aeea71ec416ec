"""Training through a real vLLM server the trainer launches (engine.kind vllm): it learns, and a killed server
stops the run with a clear error, never a hang, leaving no process and no pushed weights behind. Async runs with
vLLM's per-token versions: tests/trainer/engines/vllm/test_vllm.py (pushes) and test_ray_vllm.py."""

from __future__ import annotations

import asyncio
import math
import os
import signal
from pathlib import Path

import pytest
import yaml

from envhub.errors import EngineError
from envhub.trainer.config import config_from_dict
from envhub.trainer.engines.launcher import SHM, _group_members
from envhub.trainer.train import Trainer
from tests.vllm_support import require_vllm

# one xdist worker runs every vLLM test: vLLM pins its OpenMP threads to the cores, and the training tests check
# /dev/shm as a whole for the weights the pushes leave behind
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]
REPO = Path(__file__).resolve().parents[2]
KILL_BY_STEP = 12  # of the config's 16: the kill comes once the run has learned, or at this step


def learned(rows: list[dict]) -> bool:
    """The last 2 steps' mean batch reward over the first 3 steps' by more than 0.06, after 5 steps at least."""
    rewards = [row["batch_reward"] for row in rows]
    return len(rewards) >= 5 and sum(rewards[-2:]) / 2 > sum(rewards[:3]) / 3 + 0.06


def ci_tiny_vllm(tmp_path: Path, **overrides) -> dict:
    data = yaml.safe_load((REPO / "configs" / "ci-tiny-vllm.yaml").read_text())
    for section, values in overrides.items():
        data[section] = {**data.get(section, {}), **values}
    data["out_dir"] = str(tmp_path)
    return data


def weights_in_shm() -> set[str]:
    return {p.name for p in SHM.glob("envhub-weights-*")} if SHM.is_dir() else set()


async def test_training_through_a_launched_vllm_learns_and_a_killed_server_stops_it_with_a_clear_error(tmp_path):
    """One launch serves both halves (a vLLM start is ~45 s of the suite quiet, ~90 s beside the other worker):
    ci-tiny learns through the server in sync steps, then its API server is SIGKILLed, as an OOM kill would."""
    require_vllm()
    shm_before = weights_in_shm()
    config = ci_tiny_vllm(
        tmp_path,
        # token-level correction on vLLM's logprobs: in a sync run its weights sit at 1 (a finite, tiny mismatch)
        algorithm={"is_correction": {"level": "token"}},
        budget={"checkpoint_every": 1000},
    )
    trainer = Trainer(config_from_dict(config))
    rows: list[dict] = []
    server_pids: list[int] = []

    def on_step(row: dict) -> None:
        rows.append(row)
        server_pids.append(trainer.engine.server.pid)
        if learned(rows) or len(rows) == KILL_BY_STEP:  # the API server only: its core and workers are orphaned
            os.kill(server_pids[-1], signal.SIGKILL)

    trainer.on_step = on_step
    with pytest.raises(EngineError, match=r"vllm server \(pid \d+\) was killed by signal 9"):
        await asyncio.wait_for(trainer.run(), timeout=900)  # an error, not a hang
    rewards = [row["batch_reward"] for row in rows]
    print(f"batch reward by step, killed after the last: {[round(r, 3) for r in rewards]}")
    assert learned(rows), rewards  # seen: 0.36-0.37 over the first 3 steps, 0.44-0.50 by step 6-7 (or 7-12)
    assert all(row["push_s"] > 0 and 0 < row["push_paused_s"] <= row["push_s"] for row in rows)
    learner = [row["learner"] for row in rows]
    # sync: vLLM sampled with the weights the learner starts each step from, so their logprobs agree (fp32)
    assert all(abs(stats["is_kl_k1"]) < 1e-3 for stats in learner), [stats["is_kl_k1"] for stats in learner]
    assert all(0 < stats["is_weight_mean"] <= 2.0 and math.isfinite(stats["is_kl_k1"]) for stats in learner)
    assert len(set(server_pids)) == 1 and not _group_members(server_pids[0])  # the orphaned core and workers too
    assert weights_in_shm() == shm_before  # every pushed state dict was removed from RAM, on the error path too
