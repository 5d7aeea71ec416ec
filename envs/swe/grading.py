"""Grade a patch the way SWE-bench does: fresh sandbox, repo at base_commit, patch + test_patch, run the tests.

`grade(instance, model_patch, pool, repos_dir)` returns a `GradeResult`; nothing the patch or the
tests do (not applying, hanging, printing megabytes) raises: it becomes `error` and `resolved=False`.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from envhub.envs.swe.tasks import DEFAULT_TEST_CMD, SWEInstance
from envhub.errors import EnvhubError

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "envhub",
    "GIT_AUTHOR_EMAIL": "agent@envhub.invalid",
    "GIT_COMMITTER_NAME": "envhub",
    "GIT_COMMITTER_EMAIL": "agent@envhub.invalid",
    "GIT_AUTHOR_DATE": "1704067200 +0000",
    "GIT_COMMITTER_DATE": "1704067200 +0000",
    "HOME": "/tmp",
    "GIT_CONFIG_NOSYSTEM": "1",
}
PASSING = ("PASSED", "XFAIL")
_REPORT_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+?)(?: - .*)?$", re.MULTILINE)
_APPLY_ATTEMPTS = (
    "git apply --whitespace=nowarn {f}",
    "git apply --whitespace=nowarn --ignore-whitespace --recount -C1 {f}",
    "command -v patch >/dev/null && patch --batch --forward -p1 --fuzz=3 --dry-run -i {f} >/dev/null && patch --batch "
    "--forward -p1 --fuzz=3 -i {f}",
)


#: Why a patch could not be evaluated: "setup" (repository, sandbox or test patch), "patch" (the patch does not
#: apply), "no_test_run" (the test run ended without running its tests) or "timeout" (the test run was killed).
ErrorKind = Literal["setup", "patch", "no_test_run", "timeout"]
PYTEST_EXIT_CODES = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests collected"}


class RepoError(EnvhubError):
    """A task's repository or base commit that cannot be used."""


class GradingError(EnvhubError):
    """An episode whose diff could not be graded (broken test setup, killed test run, sandbox failure)."""


@dataclass(frozen=True)
class GradeResult:
    """The verdict on one patch: resolved iff every FAIL_TO_PASS and PASS_TO_PASS test passed."""

    instance_id: str
    resolved: bool
    tests: dict[str, str] = field(default_factory=dict)  # node id -> PASSED / FAILED / ERROR / MISSING ...
    error: str | None = None
    patch_applied: bool = False
    duration: float = 0.0
    log: str = ""
    grader: str = "envhub-pytest"  # or "swebench" (the official harness) or "r2egym" (expected test statuses)
    tests_status: dict[str, dict[str, list[str]]] | None = (
        None  # SWE-bench's FAIL_TO_PASS / PASS_TO_PASS success / failure
    )
    error_kind: ErrorKind | None = None  # set with `error`: the patch could not be evaluated, and why
    note: str = ""  # why a verdict the test table does not explain was reached (e.g. the patch broke the test run)

    def __post_init__(self) -> None:
        if self.error and self.error_kind is None:  # an error always says what kind it is (setup unless told)
            object.__setattr__(self, "error_kind", "setup")

    @property
    def is_error(self) -> bool:
        """True when the patch could not be evaluated (SWE-bench's `error_ids`), whatever the test table holds:
        its placeholders (MISSING) are no verdict."""
        return self.error_kind is not None

    @property
    def reason(self) -> str:
        """One line saying why the instance is (not) resolved."""
        if self.resolved:
            return "all FAIL_TO_PASS and PASS_TO_PASS tests pass"
        if self.error:
            return self.error
        if self.note:
            return self.note
        failing = [t for t, outcome in self.tests.items() if outcome not in PASSING]
        return f"{len(failing)} test(s) not passing: " + ", ".join(f"{t} ({self.tests[t]})" for t in failing[:5])

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict for reports and `info`."""
        return {
            "instance_id": self.instance_id,
            "resolved": self.resolved,
            "error": self.error,
            "error_kind": self.error_kind,
            "reason": self.reason,
            "patch_applied": self.patch_applied,
            "duration": round(self.duration, 3),
            "tests": self.tests,
            "grader": self.grader,
        }

    def swebench_report(self, model_patch: str | None) -> dict[str, Any]:
        """This verdict in the official harness's per-instance report format."""
        return {
            "patch_is_None": model_patch is None,
            "patch_exists": model_patch is not None,
            "patch_successfully_applied": self.patch_applied,
            "resolved": self.resolved,
            **({"tests_status": self.tests_status} if self.tests_status is not None else {}),
        }


def tests_status(instance: SWEInstance, outcomes: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """SWE-bench's `tests_status` block from per-test outcomes."""

    def split(tests: tuple[str, ...]) -> dict[str, list[str]]:
        return {
            "success": [t for t in tests if outcomes.get(t) in PASSING],
            "failure": [t for t in tests if outcomes.get(t) not in PASSING],
        }

    return {
        "FAIL_TO_PASS": split(instance.FAIL_TO_PASS),
        "PASS_TO_PASS": split(instance.PASS_TO_PASS),
        "FAIL_TO_FAIL": {"success": [], "failure": []},
        "PASS_TO_FAIL": {"success": [], "failure": []},
    }


def parse_pytest_report(output: str) -> dict[str, str]:
    """Per-test outcomes from the short summary that `pytest -rA` prints (`PASSED tests/x.py::test_y`)."""
    return {node: outcome for outcome, node in _REPORT_LINE.findall(output)}


def test_run_error(
    exit_code: int | None, timed_out: bool, found: dict[str, str], output: str, timeout: float
) -> tuple[ErrorKind, str] | None:
    """Why a test run gave no verdict, with the exit code and the output's tail: killed by `timeout`, or ended
    without running its tests (no per-test results, or pytest's internal error); None for a run that ran."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    tail = " | ".join(lines[-4:])[-600:] or "no output"
    if timed_out:
        return "timeout", f"tests timed out after {timeout:g} s; output ends: {tail}"
    if found and exit_code != 3:
        return None
    meaning = PYTEST_EXIT_CODES.get(exit_code) if exit_code is not None else None
    code = (
        f"exit code {exit_code}" + (f", pytest's {meaning}" if meaning else "")
        if exit_code is not None
        else "no results"
    )
    return "no_test_run", f"the test run never ran the tests ({code}): {tail}"


@lru_cache(maxsize=256)
def _archive(repo_path: str, commit: str) -> bytes:
    result = subprocess.run(
        ["git", "-C", repo_path, "archive", "--format=tar", f"{commit}^{{commit}}"], capture_output=True
    )
    if result.returncode != 0:
        raise RepoError(f"bad base_commit {commit} in {repo_path}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout


def repo_path(instance: SWEInstance, repos_dir: str | Path) -> Path:
    """The instance's local repository (repos_dir/owner__name); RepoError when it is missing."""
    path = Path(repos_dir) / instance.repo_dirname
    if not (path / ".git").exists() and not (path / "HEAD").exists():
        raise RepoError(f"repo missing: {path} is not a git repository", hint=f"clone {instance.repo} into {path}")
    return path


async def repo_archive(instance: SWEInstance, repos_dir: str | Path) -> bytes:
    """A tar of the repository's tree at base_commit (cached per repo and commit)."""
    return await asyncio.to_thread(_archive, str(repo_path(instance, repos_dir)), instance.base_commit)


def repo_dir(sandbox: Any) -> str:
    """Where the task's repository lives inside `sandbox` (`/workspace/repo` on Docker and bwrap)."""
    return f"{(sandbox.workdir or '/workspace').rstrip('/')}/repo"


async def load_repo(sandbox: Any, instance: SWEInstance, repos_dir: str | Path) -> str:
    """Put the repo at base_commit into the sandbox as a fresh one-commit git repository (no history to peek
    at); returns that commit's hash inside the sandbox."""
    dest = repo_dir(sandbox)
    await sandbox.write_archive(await repo_archive(instance, repos_dir), dest)
    script = "git init -q && git add -A && git commit -q --no-verify -m base && git tag base && git rev-parse HEAD"
    result = await sandbox.exec(script, timeout=120, cwd=dest, env=GIT_IDENTITY)
    if result.exit_code != 0:
        raise RepoError(
            f"cannot set up the repository in the sandbox: {(result.stderr or result.stdout).strip()[-300:]}"
        )
    return result.stdout.strip()


async def apply_patch(sandbox: Any, patch: str, name: str) -> str | None:
    """Apply a unified diff to the sandbox's repo; None on success, else the error output."""
    if not patch.strip():
        return None
    cwd = repo_dir(sandbox)
    path = f"{cwd}/../.envhub/{name}.diff"
    await sandbox.write_file(path, patch if patch.endswith("\n") else patch + "\n")
    errors = ""
    for attempt in _APPLY_ATTEMPTS:
        result = await sandbox.exec(attempt.format(f=path), timeout=60, cwd=cwd, env=GIT_IDENTITY)
        if result.exit_code == 0 and not result.timed_out:
            return None
        errors = errors or (result.stderr or result.stdout).strip()
    return errors[-500:] or "the patch does not apply"


def files_in_patch(patch: str) -> list[str]:
    """Paths a unified diff modifies (the b/ side of its `diff --git` headers)."""
    return re.findall(r"^diff --git a/\S+ b/(\S+)$", patch, re.MULTILINE)


def test_command(instance: SWEInstance, tests: tuple[str, ...]) -> str:
    """The shell command that runs `tests` for this instance."""
    return f"{instance.test_cmd or DEFAULT_TEST_CMD} " + " ".join(shlex.quote(t) for t in tests)


async def run_tests(
    sandbox: Any, instance: SWEInstance, tests: tuple[str, ...], timeout: float
) -> tuple[dict[str, str], str, tuple[ErrorKind, str] | None]:
    """Run `tests` in the sandbox's repo; (outcome per test, output tail, (error kind, error) or None)."""
    result = await sandbox.exec(
        test_command(instance, tests),
        timeout=timeout,
        cwd=repo_dir(sandbox),
        env={"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    output = result.stdout + result.stderr
    found = parse_pytest_report(output)
    outcomes = {t: found.get(t, "MISSING") for t in tests}
    # stderr carries pytest's usage errors; its tail goes first in the error when there is one
    tail = result.stderr if result.stderr.strip() else result.stdout
    error = test_run_error(result.exit_code, result.timed_out, found, tail, timeout)
    return outcomes, output[-4000:], error


async def grade_in_sandbox(
    sandbox: Any, instance: SWEInstance, model_patch: str, repos_dir: str | Path, *, test_timeout: float = 300
) -> GradeResult:
    """Grade `model_patch` inside an already-acquired fresh sandbox."""
    started = time.perf_counter()

    def done(**kwargs: Any) -> GradeResult:
        return GradeResult(instance.instance_id, duration=time.perf_counter() - started, **kwargs)

    try:
        await load_repo(sandbox, instance, repos_dir)
    except RepoError as exc:
        return done(resolved=False, error=str(exc))
    problem = await apply_patch(sandbox, model_patch, "model")
    if problem:
        return done(resolved=False, error=f"model patch does not apply: {problem}", error_kind="patch")
    # Like SWE-bench: the test files the test patch touches are reset first, so edits to them do not count.
    touched = " ".join(shlex.quote(p) for p in files_in_patch(instance.test_patch))
    if touched:
        await sandbox.exec(
            f"git checkout -q base -- {touched} 2>/dev/null; true", timeout=60, cwd=repo_dir(sandbox), env=GIT_IDENTITY
        )
    problem = await apply_patch(sandbox, instance.test_patch, "tests")
    if problem:
        return done(resolved=False, patch_applied=True, error=f"test patch does not apply: {problem}")
    outcomes, log, error = await run_tests(sandbox, instance, instance.tests, test_timeout)
    kind, message = error if error else (None, None)
    return done(
        resolved=error is None and all(outcomes[t] in PASSING for t in instance.tests),
        tests=outcomes,
        error=message,
        error_kind=kind,
        patch_applied=True,
        log=log,
        tests_status=tests_status(instance, outcomes),
    )


async def grade(
    instance: SWEInstance, model_patch: str, pool: Any, repos_dir: str | Path, *, test_timeout: float = 300
) -> GradeResult:
    """Grade `model_patch` for `instance` in a fresh sandbox from `pool`."""
    try:
        async with pool.acquire() as sandbox:
            return await grade_in_sandbox(sandbox, instance, model_patch, repos_dir, test_timeout=test_timeout)
    except EnvhubError as exc:
        return GradeResult(instance.instance_id, resolved=False, error=f"sandbox failure: {exc}")
