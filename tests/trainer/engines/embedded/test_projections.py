"""Packed projections (CPU, bf16): the same logits as the model's own modules, packed again after any change to a
parameter, and only where oneDNN can run them."""

from __future__ import annotations

import copy

import pytest

from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.decode_step import DecodeStep
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.embedded.kv_cache import KVCache
from envhub.trainer.engines.embedded.model_runner import ModelRunner, kv_layout
from envhub.trainer.engines.embedded.projections import ModuleProjections, PackedProjections, packing_supported
from tests.trainer.engines.embedded.test_model_runner import runner_with_rows

torch = pytest.importorskip("torch")

needs_onednn_bf16 = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU or torch build has no oneDNN bf16 matmul",
)


@pytest.fixture
def bf16_model(tiny_model):
    return copy.deepcopy(tiny_model).to(torch.bfloat16)


def run_steps(model, prompts, packed, decode_steps=3):
    """Prefill `prompts`, then greedy decode steps; every step's logits."""
    with torch.inference_mode():
        runner, first = runner_with_rows(model, prompts, packed=packed)
        outputs = [first]
        step = DecodeStep(runner)
        for _ in range(decode_steps):
            outputs.append(step(outputs[-1].argmax(-1).tolist()))
    return runner, outputs


@needs_onednn_bf16
def test_packed_projections_give_the_modules_logits(bf16_model, tokenizer):
    prompts = [tokenizer.encode(t) for t in ("Hello there", "a", "The quick brown fox jumps over the lazy dog")]
    packed_runner, packed = run_steps(bf16_model, prompts, packed=None)
    module_runner, reference = run_steps(bf16_model, prompts, packed=False)
    assert isinstance(packed_runner.projections, PackedProjections)
    assert isinstance(module_runner.projections, ModuleProjections)
    for got, want in zip(packed, reference):
        # q|k|v and gate|up run as one matmul each: the same dot products, so the same bf16 numbers
        assert torch.equal(got, want)


@needs_onednn_bf16
@pytest.mark.parametrize("change", ["in_place", "load_state_dict", "new_tensor"])
def test_a_changed_parameter_is_packed_again_before_the_next_step(bf16_model, tokenizer, change):
    prompts = [tokenizer.encode("Hello there")]
    runner, before = run_steps(bf16_model, prompts, packed=True, decode_steps=0)
    mlp = bf16_model.model.layers[0].mlp
    with torch.no_grad():
        if change == "in_place":
            mlp.down_proj.weight.mul_(-3.0)
        elif change == "load_state_dict":
            state = {k: v * -3.0 for k, v in mlp.down_proj.state_dict().items()}
            mlp.down_proj.load_state_dict(state)
        else:
            mlp.down_proj.weight.data = mlp.down_proj.weight.data * -3.0
    repacked = runner.projections.refresh()
    assert repacked == 1  # down_proj of layer 0 only
    assert runner.projections.refresh() == 0
    _, after = run_steps(bf16_model, prompts, packed=True, decode_steps=0)
    _, reference = run_steps(bf16_model, prompts, packed=False, decode_steps=0)
    assert torch.equal(after[0], reference[0])
    assert not torch.equal(after[0], before[0])


@needs_onednn_bf16
async def test_the_engine_packs_at_a_weight_update_and_serves_the_new_weights(bf16_model, tiny_model, tokenizer):
    prompt = tokenizer.encode("The quick brown fox")
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    engine = EmbeddedEngine(bf16_model, tokenizer)
    plain = EmbeddedEngine(copy.deepcopy(bf16_model), tokenizer, pack_weights=False)
    try:
        assert isinstance(engine.runner.projections, PackedProjections)
        first = await engine.generate(prompt, greedy)
        assert first.output_ids == (await plain.generate(prompt, greedy)).output_ids
        new = {k: v.detach() * 1.5 for k, v in tiny_model.state_dict().items()}
        await engine.update_weights(new)
        await plain.update_weights(new)
        assert engine.runner.projections.refresh() == 0  # the update packed them already
        second = await engine.generate(prompt, greedy)
        assert second.output_ids == (await plain.generate(prompt, greedy)).output_ids
        assert second.output_ids != first.output_ids
    finally:
        await engine.close()
        await plain.close()


def test_packing_is_refused_where_it_cannot_run_and_off_by_choice(tiny_model, bf16_model):
    assert "bf16" in packing_supported(tiny_model)  # fp32: the model's modules (MKL's fp32 GEMM)
    cache = KVCache(kv_layout(tiny_model), 1 << 20, max_rows=2, max_tokens=64)
    assert isinstance(ModelRunner(tiny_model, cache).projections, ModuleProjections)
    with pytest.raises(ValueError, match="cannot pack this model's projections: packing is for bf16"):
        ModelRunner(tiny_model, cache, packed=True)
    bf16_cache = KVCache(kv_layout(bf16_model), 1 << 20, max_rows=2, max_tokens=64)
    assert isinstance(ModelRunner(bf16_model, bf16_cache, packed=False).projections, ModuleProjections)
