"""Model shapes for the dry-run: the shipped table against transformers' own parameter counts, config.json reading,
name matching, and the error for a model nobody can size."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from envhub.errors import ConfigError
from envhub.trainer.config import ModelConfig
from envhub.trainer.placement.shapes import KNOWN_SHAPES, known_name, model_shape, shape_from_config


def hf_config(shape):
    """The transformers config of a table entry (Qwen3 when it norms q/k, Qwen2 with a qkv bias, else Llama)."""
    kwargs = dict(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=shape.tied_embeddings,
    )
    if shape.qk_norm:
        return Qwen3Config(head_dim=shape.head_dim, **kwargs)
    return (Qwen2Config if shape.qkv_bias else LlamaConfig)(**kwargs)


@pytest.mark.parametrize("key", sorted(KNOWN_SHAPES))
def test_every_table_shape_has_the_parameter_count_transformers_builds(key):
    shape = KNOWN_SHAPES[key]
    with torch.device("meta"):  # no memory: only the parameter shapes
        model = AutoModelForCausalLM.from_config(hf_config(shape))
    assert shape.params() == sum(p.numel() for p in model.parameters())


def test_published_sizes_come_out():
    billions = {k: round(s.params() / 1e9, 2) for k, s in KNOWN_SHAPES.items()}
    assert billions["qwen2.5-7b"] == 7.62 and billions["qwen3-8b"] == 8.19 and billions["llama-3.1-8b"] == 8.03
    assert billions["qwen2.5-1.5b"] == 1.54 and billions["smollm2-135m"] == 0.13


def test_a_local_directory_gives_its_own_config(tmp_path):
    config = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    (tmp_path / "config.json").write_text(config.to_json_string())
    shape, source = model_shape(ModelConfig(name=str(tmp_path)))
    assert source.endswith("config.json") and shape.layers == 3 and shape.qkv_bias
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert shape.params() == sum(p.numel() for p in model.parameters())


def test_the_tiny_model_is_sized_as_it_is_built():
    from envhub.trainer.models import load_tokenizer, tiny_llama

    config = ModelConfig(name="tiny", tiny_layers=3, tiny_hidden=64, tiny_heads=2)
    model = tiny_llama(load_tokenizer("tiny"), hidden_size=64, num_layers=3, num_heads=2)
    assert model_shape(config)[0].params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("/data/Meta-Llama-3.1-8B-Instruct/", "llama-3.1-8b"),
        ("qwen3-8b-base", "qwen3-8b"),
        ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "smollm2-1.7b"),
        ("/data/MyModel-3B", None),
    ],
)
def test_names_match_the_table_by_their_last_component(name, key):
    assert known_name(name) == key


def test_an_unknown_model_without_config_is_refused_with_the_known_names():
    with pytest.raises(ConfigError, match="cannot size model '/nowhere/MyModel-3B'") as info:
        model_shape(ModelConfig(name="/nowhere/MyModel-3B"))
    assert "Qwen2.5-1.5B" in info.value.hint and "local Hugging Face directory" in info.value.hint


def test_a_config_json_without_sizes_names_what_it_lacks(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(ConfigError, match="lacks vocab_size, intermediate_size"):
        model_shape(ModelConfig(name=str(tmp_path)))
    with pytest.raises(ConfigError, match="lacks"):
        shape_from_config({"hidden_size": "big"}, "x")
