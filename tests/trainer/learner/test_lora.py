"""LoRA (peft): adapters trained, base frozen, merged weights served, checkpoints hold the adapter and resume."""

import copy

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.config import LoraConfig, config_from_dict
from envhub.trainer.learner.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from envhub.trainer.learner.step import Learner, sequence_logprobs
from envhub.trainer.models import tiny_llama
from tests.trainer.learner.conftest import algo, make_groups

pytest.importorskip("peft")
LORA = LoraConfig(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"])


def test_adapters_train_base_stays_and_engine_gets_peft_merged_weights(tiny_model, tokenizer):
    groups = make_groups(tiny_model)
    base = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    learner = Learner(tiny_model, algo(lr=1e-2), 1.0, 0, lora=LORA)
    trainable = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    learner.step(groups)
    learner.step(groups)
    merged = learner.engine_state(torch.float32)
    assert set(merged) == set(base)  # the served model's own names: no lora_ / base_layer
    oracle = copy.deepcopy(learner.model).merge_and_unload()  # peft's own merge as the reference
    for name, tensor in oracle.named_parameters():
        assert torch.allclose(merged[name], tensor, atol=1e-6), name
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(merged["model.layers.0.self_attn.k_proj.weight"], base["model.layers.0.self_attn.k_proj.weight"])
    # a plain model with the merged weights scores tokens exactly as the adapted one
    served = tiny_llama(tokenizer, seed=7)
    served.load_state_dict(merged)
    ids = torch.tensor([groups[0][0].input_ids])
    ones = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.allclose(
            sequence_logprobs(served, ids, ones, 1.0), sequence_logprobs(learner.model, ids, ones, 1.0), atol=1e-5
        )


def test_checkpoint_holds_the_adapter_and_resumes(tiny_model, tokenizer, tmp_path):
    learner = Learner(tiny_model, algo(lr=1e-2), 1.0, 0, lora=LORA)
    learner.step(make_groups(tiny_model))
    snap = learner.checkpoint_state()
    path = save_checkpoint(tmp_path, 1, learner.model, None, snap.optimizer, {}, model_state=snap.model)
    assert (path / "adapter_model.safetensors").exists() and not (path / "model.safetensors").exists()
    fresh = Learner(tiny_llama(tokenizer, seed=0), algo(lr=1e-2), 1.0, 0, lora=LORA)
    load_checkpoint(latest_checkpoint(tmp_path), fresh.model, fresh.optimizer)
    for name, tensor in learner.model.named_parameters():
        assert torch.equal(dict(fresh.model.named_parameters())[name], tensor), name
    with pytest.raises(ConfigError, match="LoRA adapter but model.lora.r is 0"):
        load_checkpoint(latest_checkpoint(tmp_path), tiny_llama(tokenizer), None)
    other = Learner(tiny_llama(tokenizer), algo(), 1.0, 0, lora=LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ConfigError, match="does not match"):
        load_checkpoint(latest_checkpoint(tmp_path), other.model, None)


def test_unknown_target_module_names_the_choices(tiny_model):
    with pytest.raises(ConfigError, match="choose from .*q_proj"):
        Learner(tiny_model, algo(), 1.0, 0, lora=LoraConfig(r=4, target_modules=["query"]))


async def test_training_run_with_lora_resumes(tmp_path):
    from envhub.trainer.train import Trainer

    data = {
        "model": {"name": "tiny", "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
        "tasks": [{"env": "Letters-v0"}],
        "rollout": {"group_size": 2, "max_new_tokens": 3, "max_turns": 1},
        "algorithm": {"groups_per_step": 1, "lr": 0.01, "filter_zero_variance": False},
        "budget": {"steps": 2, "checkpoint_every": 1},
        "out_dir": str(tmp_path),
    }
    first = await Trainer(config_from_dict(data)).run()
    assert first.last_step == 2 and (latest_checkpoint(tmp_path).path / "adapter_model.safetensors").exists()
    data["budget"]["steps"] = 3
    second = await Trainer(config_from_dict(data)).run(resume=True)
    assert (second.first_step, second.last_step) == (2, 3)
