"""CI over the whole bundled set: every gold patch resolves its instance, every empty patch does not.

Graded in bubblewrap sandboxes of the base image's rootfs: the tasks' verdicts are the data's, not the backend's
(Docker grading has its own tests in test_swe_env.py and test_published.py). Quiet, the 60 gradings take 10 s there
and 28 s in Docker; in the parallel suite Docker's took 30-88 s, beside the other Docker tests."""

import pytest

from envhub.envs.swe.repos import build_bundled_repos
from envhub.envs.swe.tasks import BUNDLED_TASKS, load_instances
from envhub.envs.swe.validate import Prediction, grade_predictions


@pytest.mark.slow
async def test_gold_resolves_and_empty_does_not_for_every_bundled_task(base_rootfs):
    from envhub.sandboxes import SandboxPool

    instances = load_instances(BUNDLED_TASKS)
    repos_dir = build_bundled_repos()
    async with SandboxPool(backend="bwrap", image=base_rootfs, size=4, max_size=8) as pool:
        gold = await grade_predictions(
            instances, [Prediction(i.instance_id, i.patch, "gold") for i in instances], pool, repos_dir, concurrency=4
        )
        empty = await grade_predictions(
            instances, [Prediction(i.instance_id, "", "empty") for i in instances], pool, repos_dir, concurrency=4
        )
    ids = sorted(i.instance_id for i in instances)
    assert gold["resolved_ids"] == ids, {k: v["reason"] for k, v in gold["details"].items() if not v["resolved"]}
    assert empty["unresolved_ids"] == ids and not empty["resolved_ids"] and not empty["error_ids"]
    for inst in instances:  # the hidden tests really fail before the fix, and visible tests still pass
        tests = empty["details"][inst.instance_id]["tests"]
        assert all(tests[t] == "FAILED" for t in inst.FAIL_TO_PASS), inst.instance_id
        assert all(tests[t] == "PASSED" for t in inst.PASS_TO_PASS), inst.instance_id
