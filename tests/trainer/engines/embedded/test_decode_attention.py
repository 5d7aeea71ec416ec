"""The CPU decode-attention kernel (C, built on first use) against attention computed in float64 from the same
inputs, over the shapes decode gives it, and its build and fallback paths."""

from __future__ import annotations

import copy
import math

import pytest

from envhub.errors import EngineError
from envhub.trainer.engines.embedded import decode_attention
from envhub.trainer.engines.embedded.decode_step import DecodeStep
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.embedded.kv_cache import KVCache
from envhub.trainer.engines.embedded.model_runner import ModelRunner, kv_layout

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def kernel():
    loaded = decode_attention.load()
    if loaded is None:  # the project's machines have gcc and AVX-512: a missing kernel there is a failure
        reason = decode_attention.unavailable_reason()
        if "AVX-512" in (reason or ""):
            pytest.skip(reason)
        pytest.fail(f"the decode-attention kernel did not load: {reason}")
    return loaded


def reference(q, keys, values, lengths, scale):
    """Attention of q [rows, heads, group, dim] over keys/values [slots, heads, capacity, dim], float64."""
    rows = q.shape[0]
    out = torch.empty(q.shape, dtype=torch.float64)
    for row in range(rows):
        n = int(lengths[row])
        k, v = keys[row, :, :n].double(), values[row, :, :n].double()
        scores = q[row].double() @ k.transpose(-1, -2) * scale  # [heads, group, n]
        out[row] = torch.softmax(scores, dim=-1) @ v
    return out


def case(dtype, rows=5, heads=3, group=3, dim=64, capacity=160, lengths=(1, 31, 32, 33, 160), seed=0, spread=1.0):
    generator = torch.Generator().manual_seed(seed)
    keys = (torch.randn(rows + 1, heads, capacity, dim, generator=generator) * spread).to(dtype)
    values = torch.randn(rows + 1, heads, capacity, dim, generator=generator).to(dtype)
    # q a strided view (the kernel reads q by its strides; only head_dim must be contiguous)
    q = torch.randn(rows + 1, heads, group, 2 * dim, generator=generator).to(dtype)[1:, :, :, dim:]
    return q, keys, values, torch.tensor(lengths[:rows], dtype=torch.long)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("group,dim", [(3, 64), (1, 16), (2, 16), (16, 128), (4, 256)])
def test_the_kernel_equals_attention_in_float64_for_every_length_around_a_block(kernel, dtype, group, dim):
    dtype = getattr(torch, dtype)
    q, keys, values, lengths = case(dtype, group=group, dim=dim)
    assert not q.is_contiguous()
    scale = 1 / math.sqrt(dim)
    out = kernel(q, keys, values, lengths, scale)
    assert out.shape == q.shape and out.dtype == dtype
    expected = reference(q, keys, values, lengths, scale)
    # float32: summation order only; bfloat16: the output's own rounding (8 bits of mantissa, |out| < ~3)
    tolerance = 2e-6 if dtype == torch.float32 else 1.6e-2
    assert (out.double() - expected).abs().max() < tolerance
    # a row with one key attends to exactly that key's value
    assert torch.equal(out[0].float(), values[0, :, :1].float().expand(-1, group, -1))


def test_scores_far_apart_and_a_maximum_in_a_later_block_are_rescaled_exactly(kernel):
    q, keys, values, lengths = case(torch.float32, rows=2, lengths=(160, 100), spread=30.0)
    keys[0, :, 150] = q[0, :, 0] * 3  # a dominant key in the last block: earlier blocks' sums are rescaled by ~e^-700
    out = kernel(q, keys, values, lengths, 0.125)
    assert torch.isfinite(out).all()
    assert (out.double() - reference(q, keys, values, lengths, 0.125)).abs().max() < 1e-5


def test_threads_change_nothing_and_keys_past_a_rows_length_are_never_read(kernel):
    q, keys, values, lengths = case(torch.bfloat16, rows=4, lengths=(7, 40, 64, 1))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(q, keys, values, lengths, 0.125)
        torch.set_num_threads(2)
        two = kernel(q, keys, values, lengths, 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)  # each (row, head) is computed whole by one thread
    poisoned_keys, poisoned_values = keys.clone(), values.clone()
    for row, n in enumerate(lengths.tolist()):
        poisoned_keys[row, :, n:] = float("nan")
        poisoned_values[row, :, n:] = float("nan")
    assert torch.equal(kernel(q, poisoned_keys, poisoned_values, lengths, 0.125), one)


def test_shapes_outside_the_kernel_are_refused_not_misread(kernel):
    q, keys, values, lengths = case(torch.float32, group=3, dim=64)
    assert kernel.supports(q, keys)
    assert not kernel.supports(q.half(), keys.half())
    assert not kernel.supports(q[..., :32], keys)  # head_dim 32 against keys of 64
    too_many = torch.zeros(5, 1, 17, 64)
    assert not kernel.supports(too_many, keys[:, :1].contiguous())
    with pytest.raises(ValueError, match="cannot take q"):
        kernel(q, keys[:, :, :, :32], values, lengths, 0.125)


def test_the_runner_decodes_with_the_kernel_as_with_sdpa_and_can_be_told_which(tiny_model, tokenizer, kernel):
    prompts = [tokenizer.encode(t) for t in ("Hello there", "a", "The quick brown fox jumps over the lazy dog")]
    outputs = []
    with torch.inference_mode():
        for native in (True, False):
            cache = KVCache(kv_layout(tiny_model), 1 << 24, max_rows=4, max_tokens=2048)
            cache.reserve(len(prompts), 64)
            for _ in prompts:
                cache.add_row()
            runner = ModelRunner(tiny_model, cache, native_decode=native)
            assert (runner.decode_kernel is not None) == native
            assert runner.decode_attention == ("native kernel" if native else "SDPA (native_decode=False)")
            runner.prefill(0, prompts, 0)
            step = DecodeStep(runner, graphs=False)
            outputs.append(torch.stack([step([5, 9, 11]) for _ in range(4)]))
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)
    half = copy.deepcopy(tiny_model).half()
    with pytest.raises(EngineError, match="native decode attention cannot be used: it does not take torch.float16"):
        ModelRunner(half, KVCache(kv_layout(half), 1 << 20, max_rows=1, max_tokens=64), native_decode=True)


async def test_an_engine_says_how_it_decodes(tiny_model, tokenizer, kernel):
    for native, attention in ((None, "native kernel"), (False, "SDPA (native_decode=False)")):
        engine = EmbeddedEngine(copy.deepcopy(tiny_model), tokenizer, native_decode=native)
        try:
            assert engine.describe() == (
                f"embedded engine: cpu, float32, projections as modules, decode attention: {attention}"
            )
        finally:
            await engine.close()


def test_a_failed_build_names_the_compiler_and_the_switch_turns_the_kernel_off(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "/bin/false")
    with pytest.raises(RuntimeError, match="/bin/false could not build decode_attention.c"):
        decode_attention.build(tmp_path)
    assert not list(tmp_path.glob("*.so"))  # nothing half-written is left to be loaded later
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(RuntimeError, match="no-such-cc"):
        decode_attention.build(tmp_path)
    monkeypatch.delenv("CC")
    monkeypatch.setenv(decode_attention.SWITCH, "sdpa")
    decode_attention._load.cache_clear()
    try:
        assert decode_attention.load() is None
        assert decode_attention.unavailable_reason() == "ENVHUB_DECODE_ATTENTION=sdpa"
    finally:
        monkeypatch.delenv(decode_attention.SWITCH)
        decode_attention._load.cache_clear()


def test_a_built_kernel_is_reused_and_a_changed_source_builds_another(kernel, tmp_path, monkeypatch):
    first = decode_attention.build()
    stamp = first.stat().st_mtime_ns
    assert first == kernel.path and decode_attention.build() == first and first.stat().st_mtime_ns == stamp
    changed = tmp_path / "src" / "decode_attention.c"
    changed.parent.mkdir()
    changed.write_text(decode_attention.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(decode_attention, "SOURCE", changed)
    second = decode_attention.build(tmp_path)
    assert second != first and second.parent == tmp_path
