"""The embedded engine's threads: the rule takes the cores other processes keep busy off its share, a fixed count
is applied on the compute thread itself, and bad settings are refused with the fix."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from envhub.errors import EngineError
from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.embedded.threads import OtherLoad, ThreadRule, threads_setting

SPIN = "import time\nwhile True:\n    pass\n"  # one busy core, no torch


def test_cores_another_process_keeps_busy_come_off_the_engines_share():
    rule = ThreadRule(cores=64)  # more cores than this machine has: only the measured load can lower the count
    spinning = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and rule.load.cores < 0.9:
            time.sleep(0.3)
            rule()
        assert rule.load.cores >= 0.9  # two spinning processes on a machine of 2 or more cores: over one core busy
        assert rule() <= 63
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def test_the_learners_reserved_threads_come_off_and_the_count_never_drops_below_one():
    reserved = {"n": 0}
    rule = ThreadRule(cores=4, reserved=lambda: reserved["n"], watch_load=False)
    assert rule() == 4
    reserved["n"] = 3
    assert rule() == 1
    reserved["n"] = 9
    assert rule() == 1


def test_other_load_is_not_remeasured_within_its_interval():
    load = OtherLoad(interval_s=60.0)
    load.cores = 1.5
    assert load.update() == 1.5  # no new interval yet: the estimate stands


async def test_a_fixed_thread_count_is_what_the_compute_thread_runs_with():
    seen: list[int] = []
    engine = EmbeddedEngine.from_pretrained("tiny", device="cpu", threads=lambda: seen.append(0) or 1)
    try:
        result = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=3, temperature=0.0))
        threads = await engine._compute.run(torch.get_num_threads)
    finally:
        await engine.close()
    assert len(result.output_ids) == 3 and len(seen) >= 3  # asked before every model step
    assert threads == 1 and engine.stats.thread_changes <= 1  # set once on its own thread, not every step


@pytest.mark.parametrize("value", [-1, "two", 1.5, True])
def test_a_bad_thread_setting_names_the_choices(value):
    with pytest.raises(EngineError, match="auto, 0 or a positive number") as caught:
        threads_setting(value)
    assert "docs/engines.md" in caught.value.hint


def test_auto_is_the_rule_zero_leaves_torch_alone_and_a_number_is_fixed():
    assert isinstance(threads_setting("auto"), ThreadRule)
    assert threads_setting(0) is None
    assert threads_setting(3)() == 3
