"""Where the CPUs go: this process's CPU time and the whole machine's busy time, read from the kernel.

A run's metrics rows and `envhub bench async` carry them, so a workload that keeps the machine's CPUs busy (a
sandboxed env whose Docker calls cost more CPU than the trainer) can be told from one that waits (a latency-bound
env): async overlaps waits, not work.
"""

from __future__ import annotations

import os
import resource
import time


def cpu_times() -> tuple[float, float, float]:
    """(wall s, this process's CPU s, the machine's busy CPU s summed over its CPUs) now."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/stat") as stat:  # "cpu  user nice system idle iowait irq softirq steal ..." in clock ticks
        ticks = [int(v) for v in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]
    return time.monotonic(), usage.ru_utime + usage.ru_stime, (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_used(before: tuple[float, float, float], after: tuple[float, float, float]) -> dict[str, float]:
    """Where the CPUs went between two `cpu_times()`: the trainer process (engine, learner, event loop) and the whole
    machine (sandboxes, dockerd and anything else running); `machine_busy` is the share of all CPUs kept busy. A
    mode that already keeps the machine busy has little for async to overlap."""
    wall, process, machine = (b - a for a, b in zip(before, after))
    cpus = os.cpu_count() or 1
    return {
        "cpus": cpus,
        "trainer_cpu_s": round(process, 2),
        "machine_cpu_s": round(machine, 2),
        "machine_busy": round(machine / (wall * cpus), 3) if wall > 0 else 0.0,
    }
