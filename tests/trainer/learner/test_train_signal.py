"""The training loop keeps going when group tasks crash, and counts what it leaves out."""

import asyncio

from envhub.trainer import train as train_module
from envhub.trainer.config import config_from_dict
from envhub.trainer.rollout.sources import LocalRollouts


async def test_crashing_groups_give_back_their_admission_slots(tmp_path, monkeypatch):
    original = LocalRollouts.play_group
    calls = []

    async def flaky(self, task, seed, group_id):
        calls.append(group_id)
        if len(calls) <= 4:  # as many crashes as the queue has slots at version 0
            raise RuntimeError("env crashed")
        return await original(self, task, seed, group_id)

    monkeypatch.setattr(LocalRollouts, "play_group", flaky)
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 2, "max_new_tokens": 3, "max_turns": 1},
            "algorithm": {"groups_per_step": 2, "max_staleness": 1, "filter_zero_variance": False},
            "budget": {"steps": 1, "checkpoint_every": 100},
            "out_dir": str(tmp_path),
        }
    )
    result = await asyncio.wait_for(train_module.Trainer(config).run(), 120)
    assert result.last_step == 1 and result.history[0]["queue"]["failed"] >= 4


async def test_run_stops_on_the_first_step_when_engine_and_learner_disagree_on_logprobs(tmp_path, monkeypatch):
    import copy

    import pytest

    from envhub.trainer.learner.step import Learner, LogprobMismatch

    real = Learner.from_config

    def learner_at_half_temperature(config, *args, **kwargs):  # the engine samples at T=1, the learner assumes T=0.5
        skewed = copy.deepcopy(config)
        skewed.rollout.temperature = 0.5
        return real(skewed, *args, **kwargs)

    monkeypatch.setattr(Learner, "from_config", learner_at_half_temperature)
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 2, "max_new_tokens": 4, "max_turns": 1, "temperature": 1.0},
            "algorithm": {"groups_per_step": 2, "filter_zero_variance": False},
            "budget": {"steps": 3},
            "out_dir": str(tmp_path),
        }
    )
    with pytest.raises(LogprobMismatch, match="temperature"):
        await asyncio.wait_for(train_module.Trainer(config).run(), 120)
    assert (
        not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text()
    )  # no step was taken
