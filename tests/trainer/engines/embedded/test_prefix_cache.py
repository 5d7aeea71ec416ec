"""Prefix reuse and chunked prefill in EmbeddedEngine: same greedy tokens as without them, fewer tokens prefilled."""

import asyncio

import pytest
import torch

from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.embedded.kv_cache import KVCache
from envhub.trainer.engines.embedded.model_runner import ModelRunner, kv_layout
from envhub.trainer.engines.embedded.prefix_cache import PrefixCache
from envhub.trainer.engines.embedded.scheduler import IDLE_PREFILL_TOKENS

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def conversation(tokenizer, turn: int) -> list[int]:
    return tokenizer.encode(f"System: you play a game with many rules. Turn {turn}: the board shows a box.")


async def three_turns(engine, tokenizer, episodes=3):
    """Multi-turn episodes: each turn's prompt is the previous prompt + the model's answer + a new observation."""

    async def episode(i):
        ids = conversation(tokenizer, i)
        outputs = []
        for turn in range(3):
            result = await engine.generate(list(ids), GREEDY)
            outputs.append(result)
            ids += result.output_ids + tokenizer.encode(f" Observation {turn}: you moved.")
        return outputs

    return await asyncio.gather(*[episode(i) for i in range(episodes)])


async def test_multi_turn_with_prefix_reuse_gives_the_same_tokens_and_logprobs_and_prefills_less(tiny_model, tokenizer):
    plain = EmbeddedEngine(tiny_model, tokenizer, prefix_cache_mb=0, prefill_chunk=0)
    cached = EmbeddedEngine(tiny_model, tokenizer, prefix_cache_mb=64, prefill_chunk=0)
    try:
        without = await three_turns(plain, tokenizer)
        with_cache = await three_turns(cached, tokenizer)
    finally:
        await plain.close()
        await cached.close()
    for episode_a, episode_b in zip(without, with_cache):
        for a, b in zip(episode_a, episode_b):
            assert a.output_ids == b.output_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert plain.stats.reused_tokens == 0 and cached.stats.reused_tokens > 0
    assert cached.prefix_cache.stats.hits >= 6  # turns 2 and 3 of every episode
    assert cached.stats.prefill_tokens < plain.stats.prefill_tokens / 2


async def test_chunked_prefill_matches_and_interleaves_with_decoding(tiny_model, tokenizer, greedy_reference):
    engine = EmbeddedEngine(tiny_model, tokenizer, prefill_chunk=8)
    long_prompt = tokenizer.encode("word " * 70)
    try:
        running = asyncio.create_task(
            engine.generate(tokenizer.encode("Hello"), SamplingParams(max_new_tokens=40, temperature=0))
        )
        while engine.stats.decode_steps < 2:
            await asyncio.sleep(0.005)
        long = await engine.generate(long_prompt, GREEDY)
        first = await running
    finally:
        await engine.close()
    assert long.output_ids == greedy_reference(tiny_model, long_prompt, GREEDY.max_new_tokens)
    assert first.output_ids == greedy_reference(tiny_model, tokenizer.encode("Hello"), 40)
    assert engine.stats.prefill_steps >= len(long_prompt) // 8
    assert engine.stats.max_prefills_between_decodes == 1  # the running request decoded between every chunk


async def test_weight_update_empties_the_cache_and_later_turns_use_new_weights(tiny_model, tokenizer, greedy_reference):
    engine = EmbeddedEngine(tiny_model, tokenizer)
    prompt = conversation(tokenizer, 0)
    try:
        first = await engine.generate(prompt, GREEDY)
        assert len(engine.prefix_cache) == 1
        state = {name: p.detach() * 1.5 for name, p in tiny_model.named_parameters()}
        await engine.update_weights(state, version=1)
        assert len(engine.prefix_cache) == 0
        follow_up = prompt + first.output_ids + tokenizer.encode(" again")
        result = await engine.generate(follow_up, GREEDY)
    finally:
        await engine.close()
    assert result.output_ids == greedy_reference(tiny_model, follow_up, GREEDY.max_new_tokens)


def test_prefill_mixing_a_reused_prefix_and_a_fresh_row_equals_separate_forward_passes(tiny_model, tokenizer):
    a = tokenizer.encode("The quick brown fox jumps over the lazy dog")
    b = tokenizer.encode("Hi")
    with torch.inference_mode():
        first = KVCache(kv_layout(tiny_model), 1 << 20, max_rows=2, max_tokens=2048)
        first.reserve(1, 16)
        first.add_row()
        ModelRunner(tiny_model, first).prefill(0, [a[:6]], 0)
        past = first.row_kv(0)
        cache = KVCache(kv_layout(tiny_model), 1 << 20, max_rows=2, max_tokens=2048)
        cache.reserve(2, 16)
        cache.add_row(past)  # a reused prefix: the row continues after it
        cache.add_row()
        mixed = ModelRunner(tiny_model, cache).prefill(0, [a[6:], b], 0)
        reference = tiny_model(torch.tensor([a])).logits[0, -1]
        reference_b = tiny_model(torch.tensor([b])).logits[0, -1]
    assert torch.allclose(mixed[0], reference, atol=1e-4) and torch.allclose(mixed[1], reference_b, atol=1e-4)
    assert cache.lengths == [len(a), len(b)]


def _kv(n, dim=4):
    return [(torch.zeros(1, 1, n, dim), torch.zeros(1, 1, n, dim))]


def test_prefix_cache_matches_longest_common_prefix_and_evicts_least_recently_used():
    cache = PrefixCache(max_bytes=2 * 2 * 20 * 4 * 4, min_reuse=2)  # room for 40 tokens of this toy KV
    cache.put(list(range(20)), _kv(20))
    cache.put([7] * 20, _kv(20))
    assert cache.match(list(range(10)) + [99])[0] == 10  # common prefix of an entry
    assert cache.match(list(range(20)))[0] == 19  # leaves the last token to prefill
    cache.put([5] * 10, _kv(10))  # over budget: evicts the least recently used ([7] * 20)
    assert cache.match([7] * 20) == (0, None) and cache.match(list(range(20)))[0] == 19
    cache.put(list(range(25)), _kv(25))  # extends an entry: replaces it
    assert len(cache) <= 2 and cache.bytes <= cache.max_bytes
    cache.put(list(range(100)), _kv(100))  # larger than the whole budget: not kept
    assert cache.match(list(range(100)))[0] < 99


@pytest.mark.parametrize("burst_chunk", [None, IDLE_PREFILL_TOKENS])
async def test_a_burst_is_prefilled_whole_before_any_row_decodes(tiny_model, tokenizer, greedy_reference, burst_chunk):
    """On a CPU (None: the engine's choice here) a burst arriving while nothing decodes is prefilled chunk by chunk;
    on a GPU (burst_chunk=IDLE_PREFILL_TOKENS) in one step; either way its rows start decoding together."""
    engine = EmbeddedEngine(tiny_model, tokenizer, prefill_chunk=8)
    if burst_chunk is not None:
        engine.scheduler.burst_chunk = burst_chunk
    burst = [tokenizer.encode(f"Episode {i}: the board shows a box and a wall.") for i in range(3)]
    assert all(len(p) > 8 for p in burst)
    try:
        results = await asyncio.gather(*[engine.generate(p, GREEDY) for p in burst])
    finally:
        await engine.close()
    tokens = sum(len(p) for p in burst)
    assert engine.stats.prefill_steps == (1 if burst_chunk else -(-tokens // 8))
    assert engine.stats.decode_rows == len(burst) * (GREEDY.max_new_tokens - 1)  # every decode step had all rows
    for prompt, result in zip(burst, results):
        assert result.output_ids == greedy_reference(tiny_model, prompt, GREEDY.max_new_tokens)
