"""The shapes an engine step runs on: batch, key-width and prefill-row buckets.

A step on an exact shape is the shortest, but every new shape costs: on CUDA a decode step is captured as a graph
per (batch bucket, key-width bucket), and on CPU oneDNN and the attention kernel keep compiled kernels (and packed
weights) per shape for the life of the process. Rounding shapes up to a few buckets bounds both.
"""

from __future__ import annotations

BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def round_up(value: int, step: int) -> int:
    """`value` rounded up to a multiple of `step`."""
    return -(-value // step) * step


def batch_bucket(rows: int, max_rows: int) -> int:
    """The smallest bucket holding `rows` rows (never more than `max_rows`, which is always a bucket itself)."""
    if rows < 1 or rows > max_rows:
        raise ValueError(f"{rows} rows is outside 1..{max_rows}")
    return min([b for b in BATCH_BUCKETS if b >= rows] + [max_rows])


def width_bucket(width: int, capacity: int, step: int = 256) -> int:
    """Keys read per row: `width` rounded up to a multiple of `step`, at most the cache's capacity."""
    if width < 1 or width > capacity:
        raise ValueError(f"key width {width} is outside 1..{capacity}")
    return min(round_up(width, step), capacity)


def projection_rows(tokens: int) -> int:
    """Rows the projections of a `tokens`-token CPU prefill step run on: rounded up to one of ~4 sizes an octave
    (at least 64; at most 25% padding), so a run meets few matmul shapes.

    oneDNN keeps a primitive per GEMM shape (up to 1024), each with a packed copy of its weight (~1 MB for
    SmolLM2's): a multi-turn run, whose prefill steps are rows x widths of ever-changing sizes, grew its RSS by ~1 GB
    that way (a loop of 3,000 random shapes: +0.9 GB at glibc's 64 KiB mmap threshold, +2.2 GB at 32 MiB).
    The CPU attention kernel does the same per (query, key) width: `ModelRunner.prefill` pads those to multiples of
    32 / 64 (3,000 random shape pairs: +0.8 GB).
    """
    if tokens <= 64:
        return 64
    return round_up(tokens, 1 << (tokens.bit_length() - 3))
