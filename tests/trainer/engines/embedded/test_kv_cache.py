"""KVCache: slots hold rows without padding, compaction keeps their tokens, the byte budget bounds everything."""

from __future__ import annotations

import pytest

from envhub.errors import EngineError
from envhub.trainer.engines.embedded.kv_cache import KVCache, KVLayout

torch = pytest.importorskip("torch")

LAYOUT = KVLayout(layers=2, kv_heads=1, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))  # 64 B/token


def row(value: float, length: int):
    return [(torch.full((1, 1, length, 4), value), torch.full((1, 1, length, 4), -value)) for _ in range(2)]


def test_rows_keep_their_tokens_through_growth_and_compaction():
    cache = KVCache(LAYOUT, 1 << 20, max_rows=8, max_tokens=4096)
    cache.reserve(2, 10)
    assert cache.add_row(row(1.0, 3)) == 0 and cache.add_row(row(2.0, 5)) == 1
    cache.reserve(3, 300)  # more rows and tokens: reallocated, live rows copied
    assert cache.slots >= 3 and cache.capacity >= 300
    cache.add_row(row(3.0, 2))
    assert cache.lengths == [3, 5, 2]
    cache.keep([0, 2])  # the middle row leaves; the last moves into its slot
    assert cache.lengths == [3, 2]
    kept = cache.row_kv(1)
    assert torch.equal(kept[1][0], torch.full((1, 1, 2, 4), 3.0)) and torch.equal(
        kept[1][1], torch.full((1, 1, 2, 4), -3.0)
    )
    assert torch.equal(cache.row_kv(0, 2)[0][0], torch.full((1, 1, 2, 4), 1.0))


def test_the_budget_bounds_rows_times_tokens_and_refuses_with_the_fix():
    cache = KVCache(LAYOUT, 64 * 1000, max_rows=8, max_tokens=4096)  # 1000 tokens of KV in all
    assert cache.fits(1, 499) and not cache.fits(1, 501)  # one row + the scratch slot
    assert cache.fits(3, 250) and not cache.fits(3, 251)
    assert not cache.fits(9, 1)  # more rows than the batch allows
    with pytest.raises(EngineError, match="kv_cache_mb") as error:
        cache.reserve(4, 400)
    assert "raise engine.kv_cache_mb" in error.value.hint
    cache.reserve(2, 300)
    assert cache.bytes <= cache.max_bytes


def test_shrink_gives_memory_back():
    cache = KVCache(LAYOUT, 1 << 22, max_rows=8, max_tokens=8192)
    cache.reserve(8, 2000)
    for _ in range(8):
        cache.add_row(row(1.0, 4))
    big = cache.bytes
    cache.keep([0])
    cache.shrink(10)
    assert cache.bytes < big / 4 and cache.lengths == [4]
    assert torch.equal(cache.row_kv(0)[0][0], torch.full((1, 1, 4, 4), 1.0))
    cache.keep([])
    cache.shrink(0)
    assert cache.bytes == 0


def test_a_static_cache_is_allocated_once_at_the_budget():
    cache = KVCache(LAYOUT, 64 * 1000, max_rows=4, max_tokens=4096, static=True)
    assert cache.slots == 4 and cache.capacity == 200  # 1000 tokens over 4 rows + scratch
    generation = cache.generation
    cache.reserve(4, 200)
    cache.add_row()
    cache.keep([])
    cache.shrink(0)
    assert cache.generation == generation and cache.capacity == 200  # never moved
    assert not cache.fits(1, 201)
    with pytest.raises(EngineError, match="holds no token"):
        KVCache(LAYOUT, 64, max_rows=4, max_tokens=4096, static=True)


def test_a_freed_cache_goes_back_to_the_os():
    """With the engine's fixed mmap threshold, freeing the cache unmaps it: RSS falls back (with glibc's moving
    threshold, parts of this size come from the heap after the first large free and stay resident)."""
    psutil = pytest.importorskip("psutil")
    from envhub.trainer.engines.embedded.hardware import fix_malloc_mmap_threshold

    if not fix_malloc_mmap_threshold():
        pytest.skip("not glibc: no fixed thresholds")
    layout = KVLayout(layers=30, kv_heads=3, head_dim=64, dtype=torch.bfloat16, device=torch.device("cpu"))
    cache = KVCache(layout, 1 << 30, max_rows=16, max_tokens=4096)
    process = psutil.Process()
    before = process.memory_info().rss
    cache.reserve(16, 512)
    cache.add_row()
    held = process.memory_info().rss
    assert held - before > 0.9 * cache.bytes
    cache.lengths.clear()
    cache.shrink(0)  # no live row: everything is given back
    assert cache.bytes == 0
    assert process.memory_info().rss - before < 0.1 * (held - before)


def test_trim_heap_gives_back_the_free_pages_between_live_blocks():
    """Blocks under the engine's mmap threshold come from the heap: freeing every other one leaves holes that stay
    resident until `trim_heap` (malloc_trim) hands their pages back."""
    psutil = pytest.importorskip("psutil")
    from envhub.trainer.engines.embedded.hardware import fix_malloc_mmap_threshold, trim_heap

    if not fix_malloc_mmap_threshold():
        pytest.skip("not glibc: no fixed thresholds")
    process = psutil.Process()
    blocks = [torch.ones(256 * 1024) for _ in range(400)]  # 1 MiB each, under the 2 MiB threshold
    del blocks[::2]  # 200 MiB of holes between the 200 MiB still held
    before = process.memory_info().rss
    assert trim_heap()
    assert before - process.memory_info().rss > 100 * 2**20
    assert all(float(block[0]) == 1.0 for block in blocks)  # the live blocks are untouched
