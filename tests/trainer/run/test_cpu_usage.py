"""CPU accounting: where the CPUs went during a run (metrics rows, `envhub bench async`)."""

from __future__ import annotations

import os
import time

from envhub.trainer.run.cpu_usage import cpu_times, cpu_used


def test_cpu_accounting_counts_this_process_within_the_machine():
    before = cpu_times()
    deadline = time.process_time() + 0.4
    while time.process_time() < deadline:  # one busy thread
        pass
    used = cpu_used(before, cpu_times())
    assert 0.35 <= used["trainer_cpu_s"] <= 1.0
    assert used["machine_cpu_s"] >= used["trainer_cpu_s"] - 0.05  # the machine's ticks include ours
    # one busy thread keeps at least 1/cpus of the machine busy, at most all of it (give or take a tick)
    assert 0.8 / (os.cpu_count() or 1) <= used["machine_busy"] <= 1.05  # ticks are 10 ms


def test_no_time_is_no_share():
    now = cpu_times()
    nothing = {"cpus": os.cpu_count(), "trainer_cpu_s": 0.0, "machine_cpu_s": 0.0, "machine_busy": 0.0}
    assert cpu_used(now, now) == nothing
