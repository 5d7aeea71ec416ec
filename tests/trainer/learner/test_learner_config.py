"""Bad learner settings fail at load time with one clear error naming the fix."""

import pytest

from envhub.errors import ConfigError
from envhub.trainer.config import config_from_dict

BASE = {"tasks": [{"env": "Letters-v0"}]}


@pytest.mark.parametrize(
    "section, match",
    [
        ({"learner": {"devices": 0}}, "learner.devices must be at least 1"),
        ({"learner": {"strategy": "zero3"}}, "must be one of ddp, fsdp"),
        ({"algorithm": {"max_tokens_per_micro_batch": 0}}, "max_tokens_per_micro_batch must be positive"),
        ({"algorithm": {"lr_schedule": "linear"}}, "must be one of constant, cosine"),
        (
            {"model": {"lora": {"r": 8}}, "learner": {"devices": 2, "strategy": "fsdp"}},
            "LoRA with learner.strategy fsdp",
        ),
        ({"model": {"lora": {"rank": 8}}}, "unknown config key 'model.lora.rank'.*known keys: r, alpha"),
        ({"learner": {"train_layers": -1}}, "learner.train_layers must be 0"),
        ({"model": {"lora": {"r": 8}}, "learner": {"train_layers": 2}}, "train_layers and model.lora both"),
    ],
)
def test_bad_learner_settings(section, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict({**BASE, **section})


def test_defaults_describe_a_single_process_fp32_master_learner():
    config = config_from_dict(BASE)
    assert (config.learner.devices, config.learner.strategy, config.model.lora.r) == (1, "ddp", 0)
    assert config.budget.checkpoint_keep == 3 and config.algorithm.max_initial_kl > 0


async def test_fp16_training_is_refused_before_anything_runs(tmp_path):
    from envhub.trainer.train import Trainer

    config = config_from_dict({**BASE, "model": {"dtype": "float16"}, "out_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="float16 is not supported.*use model.dtype: bfloat16"):
        await Trainer(config).run()
