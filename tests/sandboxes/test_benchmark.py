"""The sandbox benchmark runs end to end and writes its JSON."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.slow
def test_benchmark_writes_table_and_json(base_image, base_rootfs, tmp_path, capsys):
    import sandbox_pool

    out = tmp_path / "bench.json"
    # a quarter of the default think time: the episodes only need to hold their sandboxes while others acquire
    argv = ["--backends", "bwrap", "docker", "--n", "3", "--images", "2", "--think-s", "0.25", "--out", str(out)]
    assert sandbox_pool.main(argv) == 0
    results = json.loads(out.read_text())["results"]
    many, groups = results["docker_many_images"], results["docker_grpo_groups"]
    assert many["no_spares"]["hit_rate"] == 0.0 and many["lru_spares"]["images"] == 2
    assert groups["prewarmed"]["hit_rate"] >= groups["cold"]["hit_rate"] == 0.0
    for backend in ("docker", "bwrap"):
        row = results[backend]
        assert row["warm_acquire"]["p50_ms"] < row["cold_start"]["p50_ms"]
        assert row["exec_roundtrip"]["n"] == 3 and row["reference_exec"]["p50_ms"] > 0
    assert "cold start / warm acquire" in capsys.readouterr().out
