"""The dry-run's memory arithmetic: against measured learner peaks, peft's adapter count, the embedded engine's
KV layout, and the sharding and checkpointing rules it encodes."""

import json
from pathlib import Path

import pytest
import torch

from envhub.trainer.placement.memory import (
    LearnerSettings,
    kv_bytes_per_token,
    learner_memory,
    lora_params,
    trainable_params,
)
from envhub.trainer.placement.shapes import KNOWN_SHAPES, ModelShape

MEASURED = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "learner_memory.json"
# benchmarks/learner_memory.py's model: a tiny Llama with an 8,192-token vocabulary, fp32 on the CPU
BENCH_TINY = ModelShape("bench-tiny", 8192, 64, 128, 2, 4, 2, 16, tied_embeddings=False)


def step_bytes(row):
    """What the benchmark's peak counts: gradients, Adam states (made in the step) and the step's transients."""
    tokens = int(row["padded_tokens"] / row["micro_batches"])
    settings = LearnerSettings(compute_bytes=4, checkpointing=row["checkpointing"], micro_batch_tokens=tokens,
                               logprob_chunk=row["chunk"])  # fmt: skip
    parts = learner_memory(BENCH_TINY, settings).parts
    transient = max(parts["logits chunk"], parts.get("recomputed layer", 0))
    return parts["gradients (fp32)"] + parts["Adam states (2 x fp32)"] + parts["activations"] + transient


def test_the_learner_formula_tracks_measured_peaks_within_ten_percent():
    rows = [r for r in json.loads(MEASURED.read_text()) if r["sweep"] != "old layout"]
    assert len(rows) >= 10 and any(r["checkpointing"] for r in rows)
    ratios = {(r["sweep"], r["longest"], r["budget"]): step_bytes(r) / 2**20 / r["peak_mb"] for r in rows}
    assert all(0.9 <= ratio <= 1.1 for ratio in ratios.values()), ratios


def test_lora_adapters_count_as_peft_makes_them():
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = KNOWN_SHAPES["smollm2-135m"]
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=2,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
    )
    with torch.device("meta"):
        model = peft.get_peft_model(
            LlamaForCausalLM(config), peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"])
        )
    made = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    two_layers = ModelShape("two", 64, shape.hidden, shape.intermediate, 2, shape.heads, shape.kv_heads,
                            shape.head_dim, tied_embeddings=False)  # fmt: skip
    assert lora_params(two_layers, 8, ("q_proj", "v_proj", "down_proj")) == made


def test_kv_bytes_per_token_is_the_embedded_engines_layout():
    from envhub.trainer.engines.embedded.kv_cache import KVLayout

    shape = KNOWN_SHAPES["qwen2.5-7b"]
    layout = KVLayout(shape.layers, shape.kv_heads, shape.head_dim, torch.bfloat16, torch.device("cpu"))
    assert kv_bytes_per_token(shape, 2) == layout.bytes_per_token == 57344
    assert kv_bytes_per_token(shape, 2, tp=2) == 57344 // 2
    assert kv_bytes_per_token(shape, 2, tp=8) == 57344 // 4  # 4 kv heads over 8 GPUs: each GPU keeps one


def test_fsdp_shards_weights_gradients_and_adam_but_not_activations():
    shape = KNOWN_SHAPES["qwen2.5-7b"]
    one = learner_memory(shape, LearnerSettings(checkpointing=True)).parts
    four = learner_memory(shape, LearnerSettings(checkpointing=True, devices=4, fsdp=True)).parts
    for name in ("weights (fp32 masters)", "gradients (fp32)", "Adam states (2 x fp32)"):
        assert four[name] == pytest.approx(one[name] / 4, abs=4)
    assert four["activations"] == one["activations"] and "FSDP gathered weights" in four
    ddp = learner_memory(shape, LearnerSettings(checkpointing=True, devices=4)).parts
    assert ddp["Adam states (2 x fp32)"] == one["Adam states (2 x fp32)"]


def test_checkpointing_lora_and_top_layers_each_shrink_what_they_should():
    shape = KNOWN_SHAPES["qwen2.5-1.5b"]
    full = learner_memory(shape, LearnerSettings(micro_batch_tokens=16384))
    ckpt = learner_memory(shape, LearnerSettings(micro_batch_tokens=16384, checkpointing=True))
    assert ckpt.parts["activations"] < full.parts["activations"] / 10 and ckpt.peak < full.peak
    lora = learner_memory(shape, LearnerSettings(lora_rank=16, checkpointing=True))
    assert lora.trainable == lora_params(shape, 16, ("q_proj", "k_proj", "v_proj", "o_proj")) < shape.params() / 100
    assert lora.parts["Adam states (2 x fp32)"] == 8 * lora.trainable
    top = LearnerSettings(train_layers=4)
    assert trainable_params(shape, top) == 4 * shape.layer_params() + shape.hidden
    kl = learner_memory(shape, LearnerSettings(reference=True))
    assert kl.parts["KL reference (fp32 copy)"] == 4 * shape.params()


def test_the_docs_table_is_what_the_code_computes():
    from envhub.trainer.placement.report import memory_table_markdown

    text = (Path(__file__).resolve().parents[3] / "docs" / "gpu.md").read_text()
    table = text.split("<!-- memory-table -->\n", 1)[1].split("\n<!-- /memory-table -->", 1)[0]
    assert table == memory_table_markdown(), "regenerate docs/gpu.md's table with report.memory_table_markdown()"
