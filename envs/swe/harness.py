"""Grade a patch for any instance the way its own data set grades it, in a fresh sandbox.

- no image: envhub's grading in the base image with the repo from `repos_dir` (`grading.grade`);
- repos the `swebench` package knows (repo + version): the official eval script and log parser, and its report;
- R2E-Gym: the image's `run_tests.sh` over its hidden tests, every status equal to `expected_output_json`;
- everything else (SWE-Gym, SWE-smith, explicit images): pytest on FAIL_TO_PASS + PASS_TO_PASS in the image.

Every path returns a `GradeResult` carrying SWE-bench's `tests_status`; nothing a patch or test does raises.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from dataclasses import replace
from typing import Any

from envhub.envs.swe import grading, official, workspace
from envhub.envs.swe.grading import (
    PASSING,
    GradeResult,
    RepoError,
    files_in_patch,
    parse_pytest_report,
    test_run_error,
    tests_status,
)
from envhub.envs.swe.tasks import DEFAULT_TEST_CMD, SWEInstance
from envhub.errors import EnvhubError

PATCH_FILE = "/tmp/envhub-model.diff"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def grader_for(instance: SWEInstance) -> str:
    """Which grader `grade` uses for the instance."""
    if not instance.image:
        return "envhub-pytest"
    if official.knows(instance):
        return "swebench"
    return "r2egym" if instance.dataset == "r2egym" else "envhub-pytest"


async def grade(
    instance: SWEInstance, model_patch: str, pool: Any, repos_dir: Any = None, *, test_timeout: float = 300
) -> GradeResult:
    """Grade `model_patch` for `instance` in a fresh sandbox from `pool` (a `MultiImagePool` for image instances).

    A test run that never ran or was killed is no verdict (an error), unless the tests run without the patch:
    then the patch broke them (deleted a test file, hung in an import), a failure graded like any other."""
    result = await _grade_once(instance, model_patch, pool, repos_dir, test_timeout)
    if result.error_kind not in ("no_test_run", "timeout") or not model_patch.strip():
        return result
    baseline = await _grade_once(instance, "", pool, repos_dir, test_timeout)
    if baseline.is_error:  # the test setup itself is broken: no verdict on the patch
        return result
    note = f"the patch broke the test run (it runs without the patch): {result.error}"
    return replace(result, error=None, error_kind=None, note=note, duration=result.duration + baseline.duration)


async def _grade_once(
    instance: SWEInstance, model_patch: str, pool: Any, repos_dir: Any, test_timeout: float
) -> GradeResult:
    if not instance.image:
        return await grading.grade(instance, model_patch, pool, repos_dir, test_timeout=test_timeout)
    started = time.perf_counter()
    try:
        async with workspace.acquire(pool, instance) as sandbox:
            result = await grade_in_image(sandbox, instance, model_patch, test_timeout=test_timeout)
    except EnvhubError as exc:
        return GradeResult(
            instance.instance_id, resolved=False, error=f"sandbox failure: {exc}", grader=grader_for(instance)
        )
    return result if result.duration else _with_duration(result, time.perf_counter() - started)


def _with_duration(result: GradeResult, seconds: float) -> GradeResult:
    return replace(result, duration=seconds)


async def apply_in(sandbox: Any, cwd: str, patch: str, commands: tuple[str, ...]) -> tuple[bool, str]:
    """Apply `patch` in `cwd` with the first of `commands` that works; (applied, output)."""
    if not patch.strip():
        return True, "empty patch: nothing to apply"
    await sandbox.write_file(PATCH_FILE, patch if patch.endswith("\n") else patch + "\n")
    output = ""
    for command in commands:
        result = await sandbox.exec(f"{command} {PATCH_FILE}", timeout=60, cwd=cwd, env=grading.GIT_IDENTITY)
        if result.ok:
            return True, result.stdout + result.stderr
        output = output or (result.stderr or result.stdout).strip()
    return False, output[-500:] or "the patch does not apply"


async def grade_in_image(
    sandbox: Any, instance: SWEInstance, model_patch: str, *, test_timeout: float = 300
) -> GradeResult:
    """Grade inside an acquired sandbox of the instance's own image."""
    started = time.perf_counter()
    grader = grader_for(instance)

    def done(**kwargs: Any) -> GradeResult:
        return GradeResult(instance.instance_id, duration=time.perf_counter() - started, grader=grader, **kwargs)

    cwd = workspace.repo_dir(sandbox, instance)
    try:
        await workspace.prepare(sandbox, instance, None)
    except RepoError as exc:
        return done(resolved=False, error=str(exc))
    if grader == "swebench":
        return await _official(sandbox, instance, model_patch, cwd, test_timeout, done)
    applied, output = await apply_in(sandbox, cwd, model_patch, official.apply_commands())
    if not applied:
        return done(resolved=False, error=f"model patch does not apply: {output}", error_kind="patch")
    if grader == "r2egym":
        return await _r2egym(sandbox, instance, cwd, test_timeout, done)
    return await _pytest(sandbox, instance, cwd, test_timeout, done)


async def _official(
    sandbox: Any, instance: SWEInstance, model_patch: str, cwd: str, timeout: float, done: Any
) -> GradeResult:
    script = await asyncio.to_thread(official.eval_script, instance)
    applied, output = await apply_in(sandbox, cwd, model_patch, official.apply_commands())
    log, timed_out = output, False
    if applied:
        await sandbox.write_file("/tmp/envhub-eval.sh", script)
        result = await sandbox.exec(
            "/bin/bash /tmp/envhub-eval.sh 2>&1", timeout=timeout, cwd=cwd, env={"PYTHONDONTWRITEBYTECODE": "1"}
        )
        log, timed_out = result.stdout + result.stderr, result.timed_out
    report, parsed = await asyncio.to_thread(
        official.report, instance, model_patch, log, applied=applied, timed_out=timed_out
    )
    # only the instance's own tests count as results: swebench's pytest parser also reads pytest's usage error
    # ("ERROR: usage: pytest [options] ...") as a test named "usage:"
    parsed = {test: status for test, status in parsed.items() if test in set(instance.tests)}
    status = report.get("tests_status")
    tests = {
        t: ("PASSED" if kind == "success" else "FAILED")
        for group in (status or {}).values()
        for kind, names in group.items()
        for t in names
    }
    # swebench fills tests_status from a log without results too (every test a failure): a run whose log parses
    # to no test never ran its tests, an error as a timeout is in swebench's run report. The eval script's exit
    # status is its last command's, not pytest's, so only the parsed log decides.
    error = test_run_error(None, timed_out, parsed, official.test_output(log), timeout) if applied else None
    if not applied:
        error = ("patch", f"model patch does not apply: {output}")
    return done(
        resolved=bool(report["resolved"]) and error is None,
        tests=tests,
        error=error[1] if error else None,
        error_kind=error[0] if error else None,
        patch_applied=applied,
        log=log[-4000:],
        tests_status=status,
    )


async def _pytest(sandbox: Any, instance: SWEInstance, cwd: str, timeout: float, done: Any) -> GradeResult:
    # As SWE-bench: the files the hidden tests live in are reset before the test patch, so edits to them do not count.
    test_files = sorted({t.split("::", 1)[0] for t in instance.tests} | set(files_in_patch(instance.test_patch)))
    if test_files:
        quoted = " ".join(shlex.quote(f) for f in test_files)
        source = workspace.CLEAN_TAG if instance.dataset == "swesmith" else shlex.quote(instance.base_commit)
        await sandbox.exec(
            f"git checkout -q {source} -- {quoted} 2>/dev/null; true", timeout=60, cwd=cwd, env=grading.GIT_IDENTITY
        )
    applied, output = await apply_in(sandbox, cwd, instance.test_patch, ("git apply --verbose",))
    if not applied:
        return done(resolved=False, patch_applied=True, error=f"test patch does not apply: {output}")
    command = f"{instance.test_cmd or DEFAULT_TEST_CMD.replace('python3', 'python')} " + " ".join(
        shlex.quote(t) for t in instance.tests
    )
    result = await sandbox.exec(command + " 2>&1", timeout=timeout, cwd=cwd, env={"PYTHONDONTWRITEBYTECODE": "1"})
    output = _ANSI.sub("", result.stdout + result.stderr)
    found = parse_pytest_report(output)
    outcomes = {t: found.get(t, "MISSING") for t in instance.tests}
    error = test_run_error(result.exit_code, result.timed_out, found, output, timeout)
    return done(
        resolved=error is None and all(outcomes[t] in PASSING for t in instance.tests),
        tests=outcomes,
        error=error[1] if error else None,
        error_kind=error[0] if error else None,
        patch_applied=True,
        log=(result.stdout + result.stderr)[-4000:],
        tests_status=tests_status(instance, outcomes),
    )


async def _r2egym(sandbox: Any, instance: SWEInstance, cwd: str, timeout: float, done: Any) -> GradeResult:
    expected = {k.split(" - ")[0]: v for k, v in dict(instance.extra.get("expected_output_json") or {}).items()}
    script = "rm -rf r2e_tests && cp -r /r2e_tests r2e_tests && bash /root/run_tests.sh 2>&1"
    result = await sandbox.exec(script, timeout=timeout, cwd=cwd, env={"PYTHONDONTWRITEBYTECODE": "1"})
    output = _ANSI.sub("", result.stdout + result.stderr)
    found = {k.split(" - ")[0]: v for k, v in parse_pytest_report(output).items()}
    outcomes = {t: found.get(t, "MISSING") for t in sorted(set(expected) | set(found))}
    error = test_run_error(result.exit_code, result.timed_out, found, output, timeout)
    # R2E-Gym's rule: the same tests as expected, each with exactly the expected status.
    resolved = error is None and found == expected
    status = {
        "FAIL_TO_PASS": {"success": [], "failure": []},
        "PASS_TO_PASS": {
            "success": [t for t in expected if found.get(t) == expected[t]],
            "failure": [t for t in expected if found.get(t) != expected[t]],
        },
        "FAIL_TO_FAIL": {"success": [], "failure": []},
        "PASS_TO_FAIL": {"success": [], "failure": []},
    }
    return done(
        resolved=resolved,
        tests=outcomes,
        error=error[1] if error else None,
        error_kind=error[0] if error else None,
        patch_applied=True,
        log=(result.stdout + result.stderr)[-4000:],
        tests_status=status,
    )
