"""The run's core-sharing rule: a learner step beside generation takes its share and leaves the rest to the engine;
alone it takes every core; fixed counts are honoured and bad ones refused; learner and engine threads run at their
priority where the process may raise it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.engines.embedded.hardware import _gnu_openmp
from envhub.trainer.engines.embedded.threads import may_raise_priority, process_nice
from envhub.trainer.run.cores import CoreShare
from tests.trainer.engines.embedded.test_compute_thread import in_new_thread


def test_by_default_a_learner_step_and_the_engine_each_take_every_core():
    share = CoreShare(cores=8)
    share._rule.load = None
    during = {}

    def step():
        during["learner"], during["engine"] = torch.get_num_threads(), share.engine_threads()

    in_new_thread(lambda: share.learner_step(step, generating=lambda: True)())
    assert during == {"learner": 8, "engine": 8}  # one process: OpenMP shares the cores between the two teams


def test_a_learner_share_beside_generation_leaves_the_engine_the_rest():
    share = CoreShare(learner_threads=4, cores=8)
    share._rule.load = None  # this machine's own load is not what this test is about
    during = {}

    def step():
        during["learner"], during["engine"] = torch.get_num_threads(), share.engine_threads()
        return "stepped"

    assert share.engine_threads() == 8
    assert in_new_thread(lambda: share.learner_step(step, generating=lambda: True)()) == "stepped"
    assert during == {"learner": 4, "engine": 4}
    assert share.engine_threads() == 8  # the step is over: every core back to the engine


def test_a_learner_step_with_nothing_generating_takes_every_core():
    share = CoreShare(cores=2)
    share._rule.load = None
    during = {}

    def step():
        during["learner"] = torch.get_num_threads()

    in_new_thread(lambda: share.learner_step(step, generating=lambda: False)())
    assert during["learner"] == 2 and share.engine_threads() == 2


class Busy:
    """Other processes keeping `cores` cores busy, as `OtherLoad` would measure them."""

    def __init__(self, cores: float) -> None:
        self.cores = cores

    def update(self) -> float:
        return self.cores


def test_cores_other_processes_keep_busy_come_off_the_learners_share_as_off_the_engines():
    """A learner step's OpenMP team, like the engine's, waits at every barrier for a thread another process has
    descheduled: beside one busy core, 2 threads took a tiny model's step from 0.55 s to 1.81 s, 1 thread to 0.86."""
    share = CoreShare(cores=4)
    share._rule.load = Busy(1.2)
    during = []

    def step():
        during.append((torch.get_num_threads(), share.engine_threads()))

    in_new_thread(lambda: share.learner_step(step, generating=lambda: False)())
    in_new_thread(lambda: share.learner_step(step, generating=lambda: True)())
    assert during == [(3, 3), (3, 3)] and share.alone() == 3
    share._rule.load = Busy(9.0)
    assert share.alone() == share.beside() == share.engine_threads() == 1  # never below one thread
    limited = CoreShare(learner_threads=2, cores=4)
    limited._rule.load = Busy(1.0)
    assert limited.beside() == 2 and limited.alone() == 3


def test_sft_takes_its_threads_from_the_rule_before_every_step(tokenizer):
    from envhub.trainer.models import tiny_llama
    from envhub.trainer.sft import SFTExample, run_sft

    model = tiny_llama(tokenizer, seed=0)
    examples = [SFTExample([1, 2, 3, 4, 5], [0, 0, 1, 1, 1]) for _ in range(6)]
    asked = []

    def threads() -> int:
        asked.append(torch.get_num_threads())
        return 1

    stats = in_new_thread(lambda: run_sft(model, examples, batch_size=2, threads=threads))
    assert stats["steps"] == 3 and len(asked) == 3


def test_fixed_counts_are_kept_and_described():
    share = CoreShare(learner_threads=3, engine_threads=1, cores=4)
    assert share.engine_threads() == 1 and share.learner_beside == 3
    assert "1 threads (engine.threads)" in share.describe() and "learner 3 threads" in share.describe()


@pytest.mark.parametrize("field", ["learner_threads", "engine_threads"])
def test_a_negative_or_fractional_count_is_refused_naming_the_setting(field):
    for bad in (-1, 1.5):
        with pytest.raises(ConfigError, match=field.replace("_threads", ".threads")) as caught:
            CoreShare(**{field: bad})
        assert "rule" in caught.value.hint


def thread_nice(tid: int | str) -> int:
    """A thread's nice value as the kernel reports it (/proc/self/task/TID/stat, field 19)."""
    with open(f"/proc/self/task/{tid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[16])


needs_priority = pytest.mark.skipif(not may_raise_priority(), reason="raising priority needs root or CAP_SYS_NICE")


@needs_priority
def test_a_learner_step_and_its_openmp_workers_run_at_the_learners_priority_then_the_thread_returns():
    share = CoreShare(cores=2, learner_priority=5)
    share._rule.load = None
    base = process_nice()
    seen = {}

    def step():
        seen["learner"] = thread_nice(threading.get_native_id())
        before = set(os.listdir("/proc/self/task"))
        torch.ones(1 << 22).mul_(2.0).sum()  # an OpenMP region: this thread's team starts now
        workers = set(os.listdir("/proc/self/task")) - before
        seen["workers"] = {thread_nice(tid) for tid in workers}

    def run():
        share.learner_step(step, generating=lambda: False)()
        return thread_nice(threading.get_native_id())

    after = in_new_thread(run)
    assert seen["learner"] == base - 5
    if _gnu_openmp() is not None:  # a team of 2: one worker started in the step, and it inherited the priority
        assert seen["workers"] == {base - 5}
    assert after == base


@needs_priority
async def test_the_engines_compute_thread_runs_at_its_priority():
    from envhub.trainer.engines.embedded.compute_thread import ComputeThread

    compute = ComputeThread("test-priority", priority=3)
    try:
        tid = await compute.run(threading.get_native_id)
        assert thread_nice(tid) == process_nice() - 3 == compute.nice_applied
    finally:
        compute.close()


def test_where_raising_priority_is_refused_the_thread_keeps_the_process_priority_without_an_error():
    # a process without CAP_SYS_NICE (setpriv drops it) asks for priority: refused, so the thread keeps nice 0 and
    # the rule says so at start
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("util-linux's setpriv is not installed")
    code = (
        "from envhub.trainer.engines.embedded.threads import may_raise_priority, raise_thread_priority\n"
        "from envhub.trainer.run.cores import CoreShare\n"
        "print(may_raise_priority(), raise_thread_priority(5), CoreShare(cores=2, engine_priority=5).describe())\n"
    )
    drop = ["--inh-caps=-sys_nice", "--ambient-caps=-sys_nice", "--bounding-set=-sys_nice"]
    out = subprocess.run([setpriv, *drop, sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    refused, nice, described = out.stdout.split(" ", 2)
    assert refused == "False" and nice == "0"
    assert "refused: needs root or CAP_SYS_NICE" in described


@pytest.mark.parametrize("field", ["learner_priority", "engine_priority"])
def test_a_priority_outside_0_to_39_is_refused_naming_the_setting(field):
    for bad in (-1, 40, True, 2.5):
        with pytest.raises(ConfigError, match=field.replace("_priority", ".priority")) as caught:
            CoreShare(**{field: bad})
        assert "default" in caught.value.hint
    assert "priority: the process's own" in CoreShare(learner_priority=0, engine_priority=0).describe()
