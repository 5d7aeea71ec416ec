"""Every published format in its own locally built image: gold resolves, empty does not, graded as its data set grades.

Images are laid out as the published ones (repo at /testbed, its own Python environment, no repos_dir) and
built once per recipe (the build is cached by content hash).
"""

import json

import gymnasium as gym
import pytest

import envhub  # noqa: F401  (registers envhub/SWE-v0)
from envhub.cli.main import main
from envhub.envs.swe.tasks import write_instances

FORMATS = ["swebench", "swegym", "r2egym", "swesmith"]
GRADERS = {"swebench": "swebench", "swegym": "envhub-pytest", "r2egym": "r2egym", "swesmith": "envhub-pytest"}


@pytest.fixture(scope="module")
def task_file(published, tmp_path_factory):
    path = tmp_path_factory.mktemp("tasks") / "all.jsonl"
    write_instances(list(published.instances.values()), path)  # envhub's own form keeps each format and image
    return path


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gold", "empty"])
def test_envhub_swe_grade_each_format(published, task_file, tmp_path, which):
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        "".join(
            json.dumps(
                {
                    "instance_id": i.instance_id,
                    "model_patch": i.patch if which == "gold" else "",
                    "model_name_or_path": which,
                }
            )
            + "\n"
            for i in published.instances.values()
        )
    )
    out = tmp_path / "report.json"
    assert (
        main(
            [
                "swe",
                "grade",
                "--tasks",
                str(task_file),
                "--predictions",
                str(preds),
                "--out",
                str(out),
                "--workers",
                "2",
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    ids = {fmt: inst.instance_id for fmt, inst in published.instances.items()}
    if which == "gold":
        assert report["resolved_ids"] == sorted(ids.values())
    else:
        assert report["resolved_ids"] == [] and report["unresolved_ids"] == sorted(ids.values())
    for fmt, iid in ids.items():
        assert report["details"][iid]["grader"] == GRADERS[fmt]
        instance_report = report["reports"][iid]  # the official per-instance report format
        assert instance_report["resolved"] is (which == "gold") and instance_report["patch_successfully_applied"]
        status = instance_report["tests_status"]
        assert set(status) == {"FAIL_TO_PASS", "PASS_TO_PASS", "FAIL_TO_FAIL", "PASS_TO_FAIL"}
        failing = status["FAIL_TO_PASS"]["failure"] + status["PASS_TO_PASS"]["failure"]
        assert (failing == []) is (which == "gold"), (fmt, status)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_gym_episode_in_the_instance_image(published, fmt):
    """gym.make with the data set's own file (no repos_dir): the repo is the image's /testbed."""
    inst = published.instances[fmt]
    env = gym.make("envhub/SWE-v0", tasks=str(published.files[fmt]), max_steps=6)
    try:
        obs, info = env.reset(options={"instance_id": inst.instance_id})
        assert "/testbed" in obs and info["instance_id"] == inst.instance_id
        obs, *_ = env.step({"name": "bash", "arguments": {"command": "command -v python"}})
        assert (
            "/root/.venv/bin/python" if fmt == "r2egym" else "/opt/miniconda3/envs/testbed/bin/python"
        ) in obs  # the image's own env
        _, reward, terminated, _, info = env.step({"name": "submit", "arguments": {}})
        assert terminated and reward == 0.0 and not info["resolved"]  # nothing changed: not resolved
        env.reset(options={"instance_id": inst.instance_id})
        patch = inst.patch.replace("'", "'\"'\"'")
        obs, *_ = env.step(
            {"name": "bash", "arguments": {"command": f"printf '%s' '{patch}' | git apply && echo applied"}}
        )
        assert "applied" in obs, obs
        _, reward, terminated, _, info = env.step({"name": "submit", "arguments": {}})
        assert reward == 1.0 and info["resolved"] and info["grade"]["grader"] == GRADERS[fmt], info["reason"]
    finally:
        env.close()


def test_missing_image_is_one_clear_error_offline(tmp_path, published, capsys):
    """No registry answers here: `docker pull` fails, and the error names the image and how to load it."""
    row = dict(published.rows["swebench"], instance_id="nobody__nothing-404")
    path = tmp_path / "missing.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(published.rows["swebench"]) + "\n")
    assert main(["swe", "prepare", "--tasks", str(path)]) == 1
    err = capsys.readouterr().err
    assert "swebench/sweb.eval.x86_64.nobody_1776_nothing-404:latest" in err and "docker load" in err
    assert "1 present" in err and "1 missing" in err


async def test_official_harness_handles_bad_patch_and_timeout(published):
    """The swebench path: a patch that does not apply is reported as such; a patch that hangs the test run (which
    runs without it) fails, with the timeout as its reason."""
    from envhub.envs.swe import harness
    from envhub.sandboxes.multipool import MultiImagePool

    inst = published.instances["swebench"]
    bad = "diff --git a/nothing.py b/nothing.py\n--- a/nothing.py\n+++ b/nothing.py\n@@ -1 +1 @@\n-x\n+y\n"
    hang = inst.patch + (
        "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n"
        "@@ -0,0 +1,2 @@\n+import time\n+time.sleep(600)\n"
    )
    async with MultiImagePool(spares_budget=0) as pool:
        broken = await harness.grade(inst, bad, pool)
        slow = await harness.grade(inst, hang, pool, test_timeout=8)
    assert broken.grader == "swebench" and not broken.resolved and not broken.patch_applied
    assert "does not apply" in broken.error and broken.swebench_report(bad)["patch_successfully_applied"] is False
    assert not slow.resolved and slow.patch_applied and not slow.is_error
    assert slow.reason.startswith("the patch broke the test run") and "timed out after 8 s" in slow.reason


async def test_official_harness_reports_a_test_run_that_never_ran_as_an_error(published):
    """swebench fills tests_status even from a log without results (every test a failure); a log that parses to no
    test at all, here because the tests' pytest.ini asks for pytest-cov, is an error."""
    import dataclasses

    from envhub.envs.swe import harness
    from envhub.sandboxes.multipool import MultiImagePool

    inst = published.instances["swebench"]
    needs_cov = (
        "diff --git a/pytest.ini b/pytest.ini\nnew file mode 100644\n--- /dev/null\n+++ b/pytest.ini\n"
        "@@ -0,0 +1,2 @@\n+[pytest]\n+addopts = --cov=exprcalc\n"
    )
    broken = dataclasses.replace(inst, test_patch=inst.test_patch + needs_cov)
    async with MultiImagePool(spares_budget=0) as pool:  # the empty patch: no second run without it to compare
        result = await harness.grade(broken, "", pool, test_timeout=60)
    assert result.grader == "swebench" and not result.resolved and result.is_error, result.reason
    assert result.error_kind == "no_test_run" and "never ran the tests (no results)" in result.error
    assert "unrecognized arguments: --cov=exprcalc" in result.error  # the tail of the test run's own output
    assert result.tests_status is not None  # swebench's own report, kept as it is
