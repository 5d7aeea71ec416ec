"""ModelRunner and DecodeStep: the cache-based forward equals transformers' own, bucketed (graph-shaped) decode
steps equal exact ones, and only supported architectures are accepted."""

from __future__ import annotations

import pytest

from envhub.errors import EngineError
from envhub.trainer.engines.embedded.decode_step import DecodeStep, StaticInputs
from envhub.trainer.engines.embedded.kv_cache import KVCache
from envhub.trainer.engines.embedded.model_runner import ModelRunner, kv_layout
from envhub.trainer.engines.embedded.shapes import batch_bucket, projection_rows, width_bucket

torch = pytest.importorskip("torch")


def runner_with_rows(model, prompts, max_rows=8, expand_gqa=None, packed=None):
    cache = KVCache(kv_layout(model), 1 << 24, max_rows=max_rows, max_tokens=2048)
    cache.reserve(len(prompts), 64)
    for _ in prompts:
        cache.add_row()
    runner = ModelRunner(model, cache, expand_gqa=expand_gqa, packed=packed)
    return runner, runner.prefill(0, prompts, 0)


def last_logits(model, ids):
    return model(torch.tensor([ids])).logits[0, -1].float()


def test_prefill_and_decode_equal_a_plain_forward_for_rows_of_different_lengths(tiny_model, tokenizer):
    prompts = [tokenizer.encode(t) for t in ("Hello there", "a", "The quick brown fox jumps over the lazy dog")]
    with torch.inference_mode():
        runner, logits = runner_with_rows(tiny_model, prompts)
        for row, prompt in enumerate(prompts):
            assert torch.allclose(logits[row], last_logits(tiny_model, prompt), atol=1e-4)
        step = DecodeStep(runner)
        contexts = [p + [7 + i] for i, p in enumerate(prompts)]
        for _ in range(3):
            out = step([c[-1] for c in contexts])
            for row, context in enumerate(contexts):
                assert torch.allclose(out[row], last_logits(tiny_model, context), atol=1e-4)
            contexts = [c + [int(out[i].argmax())] for i, c in enumerate(contexts)]
        assert runner.cache.lengths == [len(c) - 1 for c in contexts]


def test_bucketed_decode_steps_equal_exact_ones_and_padding_only_touches_the_scratch_slot(tiny_model, tokenizer):
    prompts = [tokenizer.encode(t) for t in ("Hello there", "1 2 3", "What is 7+5?")]
    with torch.inference_mode():
        exact_runner, _ = runner_with_rows(tiny_model, prompts)
        padded_runner, _ = runner_with_rows(tiny_model, prompts)
        padded_runner.cache.add_row()  # a row being prefilled sits right after the decoding rows
        bystander = padded_runner.cache.row_kv(3, 64)
        exact = DecodeStep(exact_runner, graphs=False, pad_to_buckets=False)
        padded = DecodeStep(padded_runner, graphs=False, pad_to_buckets=True, width_step=16)
        for token in (5, 9, 11):
            a, b = exact([token] * 3), padded([token] * 3)  # 3 rows run as a bucket of 4
            assert b.shape == a.shape and torch.allclose(a, b, atol=1e-5)
        assert padded_runner.cache.lengths[:3] == exact_runner.cache.lengths
        after = padded_runner.cache.row_kv(3, 64)
        assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(bystander, after))
        assert set(padded._inputs) == {4}


def test_bucket_choice():
    assert [batch_bucket(n, 64) for n in (1, 2, 3, 5, 9, 13, 17, 33, 64)] == [1, 2, 4, 8, 12, 16, 24, 48, 64]
    assert batch_bucket(40, 40) == 40  # the batch limit is a bucket of its own
    assert width_bucket(1, 4096) == 256 and width_bucket(257, 4096) == 512 and width_bucket(300, 300) == 300
    with pytest.raises(ValueError):
        batch_bucket(65, 64)
    with pytest.raises(ValueError):
        width_bucket(301, 300)


def test_static_inputs_pad_rows_into_the_scratch_slot():
    inputs = StaticInputs.allocate(4, torch.device("cpu"))
    inputs.fill([5, 6], [10, 3], scratch_slot=9)
    assert inputs.tokens.tolist() == [5, 6, 0, 0]
    assert inputs.positions.tolist() == [10, 3, 0, 0]
    assert inputs.write_slots.tolist() == [0, 1, 9, 9]


def test_graphs_need_cuda_and_unsupported_models_are_refused(tiny_model):
    cache = KVCache(kv_layout(tiny_model), 1 << 20, max_rows=2, max_tokens=2048)
    with pytest.raises(ValueError, match="CUDA"):
        DecodeStep(ModelRunner(tiny_model, cache), graphs=True)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32))
    with pytest.raises(EngineError, match="gpt2") as error:
        ModelRunner(gpt2, cache)
    assert "SGLang or vLLM" in error.value.hint


def test_the_cuda_prefill_path_with_expanded_heads_equals_the_gqa_path(tiny_model, tokenizer):
    # decode folds query groups on every device: the first test checks it against transformers' forward
    prompts = [tokenizer.encode(t) for t in ("Hello there", "What is 7+5?")]
    assert tiny_model.config.num_attention_heads > tiny_model.config.num_key_value_heads  # GQA is exercised
    with torch.inference_mode():
        gqa_runner, gqa_prefill = runner_with_rows(tiny_model, prompts)
        cuda_runner, cuda_prefill = runner_with_rows(tiny_model, prompts, expand_gqa=True)
        assert cuda_runner.expand_gqa and not gqa_runner.expand_gqa
    assert torch.allclose(gqa_prefill, cuda_prefill, atol=1e-5)


def test_cpu_prefill_projections_run_on_few_shapes_with_at_most_a_quarter_of_padding():

    sizes = [projection_rows(n) for n in range(1, 8193)]
    assert all(size >= n for n, size in enumerate(sizes, start=1))
    assert all(size <= max(64, 1.25 * n) for n, size in enumerate(sizes, start=1))
    assert len(set(sizes)) <= 4 * 7 + 1  # 64, then four sizes an octave up to 8192


def test_cpu_prefill_packs_pieces_of_different_lengths_over_caches_of_different_lengths(tiny_model):
    history = [list(range(10, 80)), [5, 6], list(range(100, 130))]  # 70, 2 and 30 tokens cached first
    turns = [list(range(200, 240)), [7, 8, 9], list(range(300, 317))]  # 60 new tokens: 3 x 64 if padded
    seen = []

    def runner_after_history(packed):
        cache = KVCache(kv_layout(tiny_model), 1 << 24, max_rows=4, max_tokens=2048)
        cache.reserve(len(history), 128)
        for _ in history:
            cache.add_row()
        runner = ModelRunner(tiny_model, cache, pack_prefill=packed)
        assert runner.pack_prefill is packed
        runner.prefill(0, history, 0)
        return runner, cache

    with torch.inference_mode():
        runner, cache = runner_after_history(True)
        mlp = runner.projections.mlp
        runner.projections.mlp = lambda index, x: seen.append(x.shape[0]) or mlp(index, x)
        logits = runner.prefill(0, turns, 0)
        for row, (before, turn) in enumerate(zip(history, turns)):
            assert torch.allclose(logits[row], last_logits(tiny_model, before + turn), atol=1e-4)
        padded_runner, _ = runner_after_history(False)
        assert torch.allclose(padded_runner.prefill(0, turns, 0), logits, atol=1e-4)
        for row in range(len(history)):  # the same keys and values cached
            for (k, v), (pk, pv) in zip(cache.row_kv(row), padded_runner.cache.row_kv(row)):
                assert torch.allclose(k, pk, atol=1e-4) and torch.allclose(v, pv, atol=1e-4)
    assert set(seen) == {projection_rows(60)}, f"MLP rows {set(seen)}; padded, a step runs 3 x 64 rows or more"
    assert cache.lengths[:3] == [110, 5, 47]
    # the CUDA prefill path (heads expanded) has no packed form: asking for it there leaves it off, and the
    # start line, which reads this flag, does not claim it
    cuda_cache = KVCache(kv_layout(tiny_model), 1 << 20, max_rows=1, max_tokens=64)
    cuda_path = ModelRunner(tiny_model, cuda_cache, expand_gqa=True, pack_prefill=True)
    assert cuda_path.pack_prefill is False


async def test_engine_pack_prefill_in_a_config_reaches_the_runner_and_the_start_line(tiny_model, tokenizer):
    from envhub.trainer.config import config_from_dict
    from envhub.trainer.engines.embedded.kind import EmbeddedKind

    for on in (False, True):
        config = config_from_dict(
            {"model": {"name": "tiny"}, "tasks": [{"env": "Letters-v0"}], "engine": {"pack_prefill": on}}
        )
        engine = await EmbeddedKind().build(config, tiny_model, tokenizer)
        try:
            assert engine.runner.pack_prefill is on
            assert engine.describe().endswith(", prefill packed") is on
        finally:
            await engine.close()
