"""benchmarks/server_soak.py, briefly: each server keeps serving its well-behaved clients without an error while
hostile clients get the limits' answers (408, 413, 429 / 401, sockets closed) and abandoned sessions are reaped."""

import importlib.util
import json
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("server_soak", ROOT / "benchmarks" / "server_soak.py")
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


@pytest.mark.slow
def test_a_short_soak_of_each_server_writes_its_report(tmp_path):
    # one server after another, as the benchmark runs them: at once, beside the other xdist worker on 2 cores, the
    # floods' 429 and the slow bodies' 408 would depend on how much CPU each got (and it saved 6 s of 62 in CI)
    out = tmp_path / "soak.json"
    soak.main(["--seconds", "5", "--good", "2", "--out", str(out)])
    report = json.loads(out.read_text())
    for target in ("envhub", "openenv", "engine"):
        good, hostile, memory = report[target]["well_behaved"], report[target]["hostile"], report[target]["memory_mb"]
        assert good["requests"] > 0 and good["errors"] == 0, (target, good["error_samples"])
        assert good["p50_ms"] <= good["p99_ms"] and {"rss_start", "rss_after_warmup", "rss_end"} <= set(memory)
        assert "413" in hostile["big"] and "not_finished" not in hostile, (target, hostile)
    for target in ("envhub", "openenv"):
        hostile = report[target]["hostile"]
        assert "408" in hostile["slow"] and "429" in hostile["flood"], (target, hostile)
        assert report[target]["server"]["reaped"] > 0 and report[target]["server"]["sessions"] == 0
    assert "ws CLOSE 1009" in report["openenv"]["hostile"]["big"]
    assert report["openenv"]["hostile"]["abandon"]["ws left open"] > 0  # silent sockets, closed by the reaper
    assert set(report["engine"]["hostile"]["flood"]) == {"401"}


def test_a_client_idle_past_the_timeout_is_counted_as_stalled_not_as_a_server_error():
    seen = soak.Latencies()
    assert not seen.stalled_since(time.monotonic())
    assert seen.stalled_since(time.monotonic() - soak.IDLE_TIMEOUT - 0.5)
    summary = seen.summary()
    assert summary["stalled_past_idle_timeout"] == 1 and summary["errors"] == 0
