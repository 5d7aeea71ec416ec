"""Checkpoints: every shard loaded strictly, tied heads allowed, pruning, RNG, saves off the event loop."""

import random
import threading

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.learner.checkpoint import latest_checkpoint, load_checkpoint, read_weights, save_checkpoint
from envhub.trainer.learner.step import Learner
from envhub.trainer.models import tiny_llama
from tests.trainer.learner.conftest import algo, make_groups


def trained(model):
    learner = Learner(model, algo(), 1.0, 0)
    learner.step(make_groups(model))
    return learner


def test_sharded_checkpoint_resumes_every_tensor(tiny_model, tokenizer, tmp_path):
    learner = trained(tiny_model)
    path = save_checkpoint(tmp_path, 1, tiny_model, None, learner.optimizer, {}, max_shard_size="1MB")
    shards = sorted(path.glob("model-*.safetensors"))
    assert len(shards) >= 3 and (path / "model.safetensors.index.json").exists()
    fresh = tiny_llama(tokenizer, seed=123)
    fresh_opt = Learner(fresh, algo(), 1.0, 0).optimizer
    load_checkpoint(latest_checkpoint(tmp_path), fresh, fresh_opt)
    for (name, want), got in zip(tiny_model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(want, got), name  # the old loader read the first shard only
    assert fresh_opt.state_dict()["state"].keys() == learner.optimizer.state_dict()["state"].keys()

    shards[-1].unlink()  # a copy that lost a shard is refused, never half-loaded
    with pytest.raises(ConfigError, match="lacks shards"):
        load_checkpoint(latest_checkpoint(tmp_path), fresh, None)


def test_missing_or_unknown_tensors_are_errors_but_a_tied_head_may_be_absent(tiny_model, tokenizer, tmp_path):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in tiny_model.state_dict().items()}
    path = save_checkpoint(tmp_path, 1, tiny_model, None, trained(tiny_model).optimizer, {})
    partial = dict(state)
    del partial["model.layers.1.mlp.up_proj.weight"]
    (path / "model.safetensors").unlink()
    save_file(partial, str(path / "model.safetensors"))
    with pytest.raises(ConfigError, match="missing.*up_proj"):
        load_checkpoint(latest_checkpoint(tmp_path), tiny_llama(tokenizer), None)
    save_file({**state, "model.extra.weight": torch.zeros(2)}, str(path / "model.safetensors"))
    with pytest.raises(ConfigError, match="unknown.*model.extra"):
        load_checkpoint(latest_checkpoint(tmp_path), tiny_llama(tokenizer), None)

    tied = tiny_llama(tokenizer)
    tied.config.tie_word_embeddings = True
    tied.tie_weights()
    tied_path = save_checkpoint(tmp_path / "tied", 1, tied, None, {}, {})
    assert "lm_head.weight" not in read_weights(tied_path)
    load_checkpoint(latest_checkpoint(tmp_path / "tied"), tied, None)  # the head is the embedding: fine


def test_keep_prunes_old_checkpoints_and_rng_round_trips(tiny_model, tmp_path):
    opt = trained(tiny_model).optimizer
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, tiny_model, None, opt, {}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000004", "step_000005"]
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.step == 5
    saved = torch.load(ckpt.path / "rng.pt", weights_only=False)
    assert "python" in saved and ("cuda" in saved) == torch.cuda.is_available()
    expected = (torch.rand(3), random.random())
    torch.manual_seed(99), random.seed(99)
    load_checkpoint(ckpt, tiny_model, None)
    # the checkpoint's RNG state was taken before `expected` was drawn: both draws repeat
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


async def test_trainer_saves_off_the_event_loop(tmp_path, monkeypatch):
    from envhub.trainer.config import config_from_dict
    from envhub.trainer.run import resume as resume_module
    from envhub.trainer.train import Trainer

    threads = []
    original = resume_module.save_checkpoint
    monkeypatch.setattr(
        resume_module,
        "save_checkpoint",
        lambda *a, **k: (threads.append(threading.current_thread()), original(*a, **k))[1],
    )
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 2, "max_new_tokens": 3, "max_turns": 1},
            "algorithm": {"groups_per_step": 1, "filter_zero_variance": False},
            "budget": {"steps": 3, "checkpoint_every": 1, "checkpoint_keep": 1},
            "out_dir": str(tmp_path),
        }
    )
    result = await Trainer(config).run()
    assert result.last_step == 3 and len(threads) == 3
    assert all(t is not threading.main_thread() for t in threads)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000003"]
    assert latest_checkpoint(tmp_path).state["learner"]["steps"] == 3
