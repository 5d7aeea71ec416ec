"""The learner on 2 gloo processes (DDP and FSDP2) matches the single-process step; `envhub train` with 2 devices."""

import copy
from pathlib import Path

import pytest
import torch

from envhub.trainer.config import config_from_dict
from envhub.trainer.learner.checkpoint import latest_checkpoint
from envhub.trainer.learner.distributed import start_learner_processes
from envhub.trainer.learner.step import Learner
from envhub.trainer.models import build_policy
from tests.trainer.learner.conftest import make_groups


def config(devices, strategy="ddp", **algorithm):
    return config_from_dict(
        {
            "model": {"name": "tiny", "device": "cpu"},
            "tasks": [{"env": "Letters-v0"}],
            "algorithm": {"lr": 1e-4, "max_tokens_per_micro_batch": 96, "micro_batch_size": 0, **algorithm},
            "learner": {"devices": devices, "strategy": strategy},
        }
    )


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_take_the_single_process_step(strategy):
    model, tokenizer = build_policy(config(1).model, 0)
    twin = copy.deepcopy(model)
    groups = make_groups(model, n_groups=2, group_size=3, lengths=(10, 50))
    single_learner = Learner.from_config(config(1), twin, tokenizer)
    single = single_learner.step(groups)
    group = start_learner_processes(config(2, strategy))
    try:
        learner = Learner.from_config(config(2, strategy), model, tokenizer, group)
        stats = learner.step(groups)
        weights = learner.engine_state(torch.float32)
        saved = learner.checkpoint_state()
        if strategy == "fsdp":  # resume path: rank 0's full tensors spread over the shards
            initial = build_policy(config(1).model, 0)[0].state_dict()
            learner.load_sharded(dict(initial), saved.optimizer)  # torch swaps the dict's values for shards
            reloaded = learner.engine_state(torch.float32)
            assert all(torch.equal(reloaded[n], initial[n]) for n in reloaded)
    finally:
        group.shutdown()
    assert stats["micro_batches"] == single["micro_batches"] >= 3  # split across the two processes
    assert stats["loss"] == pytest.approx(single["loss"], rel=1e-5, abs=1e-7)
    assert stats["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
    expected = dict(twin.named_parameters())
    assert set(weights) == set(expected)
    diffs = torch.cat([(weights[n] - expected[n].detach()).abs().flatten() for n in expected])
    moved = torch.cat(
        [(weights[n] - p.detach()).abs().flatten() for n, p in build_policy(config(1).model, 0)[0].named_parameters()]
    )
    assert moved.max() > 5e-5  # the step did move the weights
    # equal within float noise; Adam's sign(g) can flip only where g itself is rounding noise
    assert (diffs < 1e-6).float().mean() > 0.999 and diffs.max() <= 2.1e-4
    assert set(saved.model) >= set(expected)
    twin_optimizer = Learner.from_config(config(1), copy.deepcopy(twin), tokenizer).optimizer
    twin_optimizer.load_state_dict(
        saved.optimizer
    )  # the gathered state is torch.optim's own format, whatever the strategy
    reference = single_learner.optimizer.state_dict()["state"]
    for i, state in saved.optimizer["state"].items():
        assert torch.allclose(state["exp_avg"], reference[i]["exp_avg"], atol=1e-6)


def run_config(out_dir: Path, strategy: str, steps: int):
    return config_from_dict(
        {
            "model": {"name": "tiny", "device": "cpu"},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 2, "max_new_tokens": 3, "max_turns": 1},
            "algorithm": {"groups_per_step": 2, "lr": 0.01, "filter_zero_variance": False},
            "learner": {"devices": 2, "strategy": strategy},
            "budget": {"steps": steps, "checkpoint_every": 1},
            "out_dir": str(out_dir),
        }
    )


@pytest.mark.slow
async def test_envhub_train_with_two_learner_devices_writes_checkpoints_that_either_strategy_resumes(tmp_path):
    """FSDP from scratch, DDP resuming its checkpoint, FSDP resuming DDP's: a checkpoint does not depend on the
    strategy that wrote it (ddp: rank 0 loads, then every process takes its weights; fsdp: rank 0's tensors are
    spread over the shards). Each strategy's step against one process's: test_two_processes_take_the_single_process_step

    Rank 0 is this process, as under `envhub train` (which only builds the Trainer; its flags are tested in
    tests/trainer/test_train.py): each run still spawns its gloo follower, and a `envhub train` process for each
    of the three runs would add three imports of torch and transformers (~5 CPU s each) that prove nothing here.
    """
    from envhub.trainer.train import Trainer

    run_dir = tmp_path / "run"
    await Trainer(run_config(run_dir, "fsdp", steps=2)).run()
    ckpt = latest_checkpoint(run_dir)
    assert ckpt.step == 2
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(ckpt.path)
    assert all(torch.isfinite(p).all() for p in loaded.parameters())
    for step, strategy in ((3, "ddp"), (4, "fsdp")):
        result = await Trainer(run_config(run_dir, strategy, steps=step)).run(resume=True)
        assert (result.first_step, result.last_step) == (step - 1, step)
        assert latest_checkpoint(run_dir).step == step


def test_gpu_count_is_checked_only_for_cuda_learners(monkeypatch):
    # found on an H100 machine: `model.device: cpu` with 2 gloo learners was refused for having 1 GPU
    from envhub.errors import ConfigError
    from envhub.trainer.learner import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert distributed._uses_cuda(config(2)) is False  # model.device: cpu
    auto = config_from_dict({"model": {"name": "tiny"}, "tasks": [{"env": "Letters-v0"}], "learner": {"devices": 2}})
    assert distributed._uses_cuda(auto) is True
    with pytest.raises(ConfigError, match="only 1 GPUs are visible"):
        start_learner_processes(auto)
