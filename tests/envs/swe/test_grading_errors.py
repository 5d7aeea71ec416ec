"""A test run that never runs its tests is an error, not a failed patch: in the report, in eval and in the env.

The repository is real and tiny; one copy's pytest.ini asks for pytest-cov's `--cov`, which the sandbox's
image lacks (pytest exits 4, a usage error, before collecting anything), the other copy runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from envhub.envs.swe.tasks import SWEInstance, write_instances
from envhub.envs.swe.validate import Prediction, grade_predictions, validate_instance
from tests.swe_tiny import BROKEN_SETUP, WORKING_SETUP, diff, tiny_instance


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[SWEInstance, SWEInstance, Path]:
    """(an instance whose test setup is broken, the same task with a working setup, their repos_dir)."""
    repos_dir = tmp_path_factory.mktemp("repos")
    broken = tiny_instance(repos_dir, "broken", BROKEN_SETUP)
    working = tiny_instance(repos_dir, "working", WORKING_SETUP)
    return broken, working, repos_dir


async def test_a_test_run_that_never_starts_is_an_error_with_its_exit_code_and_stderr(tiny, docker_pool):
    broken, working, repos_dir = tiny
    gold = [Prediction(i.instance_id, i.patch, "gold") for i in (broken, working)]
    report = await grade_predictions([broken, working], gold, docker_pool, repos_dir, test_timeout=60)
    assert report["resolved_ids"] == [working.instance_id]
    assert report["error_ids"] == [broken.instance_id] and report["unresolved_ids"] == []
    assert report["completed_instances"] == 1 and report["error_instances"] == 1
    detail = report["details"][broken.instance_id]
    assert detail["error_kind"] == "no_test_run" and not detail["resolved"]
    assert "exit code 4, pytest's usage error" in detail["error"], detail
    assert "unrecognized arguments: --cov=calc" in detail["error"], detail  # the tail of pytest's stderr
    assert detail["reason"] == detail["error"]
    # the official per-instance report: the patch applied, nothing resolved
    assert report["reports"][broken.instance_id]["patch_successfully_applied"] is True
    assert report["reports"][broken.instance_id]["resolved"] is False
    problems = await validate_instance(broken, docker_pool, repos_dir, test_timeout=60)
    assert problems and "never ran the tests (exit code 4" in problems[0].message


async def test_a_killed_test_run_is_an_error_unless_the_patch_is_what_broke_the_tests(tiny, docker_pool):
    _, working, repos_dir = tiny
    hanging = tiny_instance(repos_dir, "hanging", WORKING_SETUP, conftest="import time\n\ntime.sleep(60)\n")
    # the working task's tests run without these patches: one that hangs them or breaks their setup fails
    hangs, breaks, empty = (replace(working, instance_id=f"tiny__working-{n}") for n in ("hang", "setup", "empty"))
    patches = {
        hanging.instance_id: "",  # the empty patch: nothing to hold against a run without it
        hangs.instance_id: diff(
            repos_dir / "tiny__working", "calc.py", "def add(a, b):\n    while True:\n        pass\n"
        ),
        breaks.instance_id: diff(repos_dir / "tiny__working", "pytest.ini", BROKEN_SETUP),
        empty.instance_id: "",
    }
    predictions = [Prediction(i, patch, "p") for i, patch in patches.items()]
    report = await grade_predictions(
        [hanging, hangs, breaks, empty], predictions, docker_pool, repos_dir, test_timeout=5, concurrency=4
    )
    details = report["details"]
    assert report["error_ids"] == [hanging.instance_id], details
    assert details[hanging.instance_id]["error_kind"] == "timeout"
    assert "timed out after 5 s" in details[hanging.instance_id]["error"]
    assert report["unresolved_ids"] == sorted([hangs.instance_id, breaks.instance_id, empty.instance_id]), details
    for instance, why in ((hangs, "timed out after 5 s"), (breaks, "exit code 4")):
        detail = details[instance.instance_id]
        assert detail["error_kind"] is None and detail["reason"].startswith("the patch broke the test run"), detail
        assert why in detail["reason"]
    assert details[empty.instance_id]["reason"] == "1 test(s) not passing: tests/test_calc.py::test_add (FAILED)"


async def test_eval_counts_an_ungradable_episode_as_an_env_error_with_its_message(tiny, docker_pool, tmp_path):
    from envhub.agents.expert import ExpertAgent
    from envhub.envs.swe.env import SWEEnv
    from envhub.eval import EvalConfig, evaluate

    broken, working, repos_dir = tiny
    tasks = tmp_path / "tasks.jsonl"
    write_instances([broken, working], tasks)

    def env_for(instance: SWEInstance):
        return lambda: SWEEnv(tasks, repos_dir, pool=docker_pool, instance_ids=[instance.instance_id], test_timeout=60)

    factories = {"TinyBroken-v0": env_for(broken), "TinyWorking-v0": env_for(working)}
    records = []
    summary = await evaluate(
        list(factories),
        ExpertAgent,
        episodes=1,
        concurrency=2,
        config=EvalConfig(env_factories=factories),
        on_episode=records.append,
    )
    assert summary["TinyWorking-v0"]["pass_at_k"]["1"] == 1.0 and not summary["TinyWorking-v0"]["errors"]
    assert summary["TinyBroken-v0"]["errors"] == {"env_error": 1} and summary["TinyBroken-v0"]["episodes"] == 0
    (failed,) = [r for r in records if r.env_id == "TinyBroken-v0"]
    assert failed.error.startswith("GradingError: tiny__broken-1: the episode could not be graded (no_test_run)")
    assert "exit code 4" in failed.error and "--cov=calc" in failed.error
