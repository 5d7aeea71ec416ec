"""One compute thread per engine: every torch call of a EmbeddedEngine runs on it, and the threads that only serve
the engine give their OpenMP workers back."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded import engine as engine_module
from envhub.trainer.engines.embedded.compute_thread import ComputeThread, releasing_openmp
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.embedded.hardware import _gnu_openmp, release_openmp_workers

torch = pytest.importorskip("torch")

needs_gnu_openmp = pytest.mark.skipif(_gnu_openmp() is None, reason="torch here does not run on GNU OpenMP")


def os_threads() -> set[str]:
    """This process's thread ids. Compared as sets: threads other tests left behind may end meanwhile (a count
    would then drop by one), and what matters is which threads a burst started and whether they are gone."""
    return set(os.listdir("/proc/self/task"))


def in_new_thread(fn):
    """fn() on a fresh thread (its OpenMP team is its own); returns what it returned."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()))
    thread.start()
    thread.join()
    return out["value"]


def until_gone(threads: set[str], timeout_s: float = 10.0) -> set[str]:
    """This process's threads once none of `threads` is left, or at the deadline. libgomp tells a released team to
    exit and does not join it: on a loaded machine a worker can still be listed for a moment after the call."""
    deadline = time.monotonic() + timeout_s
    while (now := os_threads()) & threads and time.monotonic() < deadline:
        time.sleep(0.01)
    return now


def parallel_work() -> None:
    torch.ones(1 << 22).mul_(2.0).sum()  # far above ATen's grain size: an OpenMP region of every thread


@needs_gnu_openmp
def test_releasing_ends_this_threads_openmp_workers_and_a_later_region_starts_new_ones(monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # 2 workers besides the calling thread, whatever this machine's CPU count
    try:

        def counts():
            before = os_threads()
            parallel_work()
            with_team = os_threads()
            assert release_openmp_workers()
            released = until_gone(with_team - before)
            parallel_work()
            return before, with_team, released, os_threads()

        before, with_team, released, again = in_new_thread(counts)
        team = with_team - before
        assert len(team) == 2  # the region started 2 workers
        assert not team & released  # releasing ended them
        assert len(again - released) == 2  # a later region starts a new team
    finally:
        torch.set_num_threads(threads)


@needs_gnu_openmp
def test_a_burst_gives_its_workers_back_even_when_it_raises():
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:

        def failing():
            parallel_work()
            raise RuntimeError("learner step failed")

        def run():
            before = os_threads()
            with pytest.raises(RuntimeError, match="learner step failed"):
                releasing_openmp(failing)()
            return before, until_gone(os_threads() - before)

        before, after = in_new_thread(run)
        assert not after - before  # no worker of the burst is left
    finally:
        torch.set_num_threads(threads)


async def test_compute_thread_runs_calls_in_order_on_one_thread_that_is_not_the_loops():
    compute = ComputeThread("test-compute")
    try:
        idents = await asyncio.gather(*[compute.run(threading.get_ident) for _ in range(8)])
        assert len(set(idents)) == 1 and idents[0] != threading.get_ident()
        assert await compute.run(lambda a, b=0: a + b, 2, b=3) == 5
        with pytest.raises(ZeroDivisionError):
            await compute.run(lambda: 1 / 0)
        assert await compute.run(threading.get_ident) == idents[0]  # an exception does not cost the thread
    finally:
        compute.close()
    again = await compute.run(threading.get_ident)  # a closed one starts a new thread on use
    compute.close()
    assert again != threading.get_ident()


async def test_every_torch_call_of_the_engine_runs_on_its_compute_thread(tiny_model, tokenizer, monkeypatch):
    """Steps (prefill, decode), KV copies when rows leave and weight loads: one thread, not the event loop's."""
    seen: dict[str, set[int]] = {}

    def watched(name, fn):
        def call(*args, **kwargs):
            seen.setdefault(name, set()).add(threading.get_ident())
            return fn(*args, **kwargs)

        return call

    engine = EmbeddedEngine(tiny_model, tokenizer)
    runner, scheduler = engine.runner, engine.scheduler
    monkeypatch.setattr(runner, "prefill", watched("prefill", runner.prefill))
    monkeypatch.setattr(runner, "decode", watched("decode", runner.decode))
    monkeypatch.setattr(scheduler, "remove", watched("remove", scheduler.remove))
    monkeypatch.setattr(engine_module, "load_state", watched("load_state", engine_module.load_state))
    try:
        prompt = tokenizer.encode("Hello there")
        await engine.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0.0))
        long = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=200, temperature=0.0)))
        while engine.stats.decode_steps < 8:
            await asyncio.sleep(0.005)
        assert await engine.abort() == 1  # the row leaves the batch: a KV copy
        await long
        await engine.update_weights({k: v.clone() for k, v in tiny_model.state_dict().items()})
    finally:
        await engine.close()
    assert set(seen) == {"prefill", "decode", "remove", "load_state"}
    threads = set().union(*seen.values())
    assert len(threads) == 1 and threading.get_ident() not in threads
