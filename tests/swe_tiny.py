"""A real, tiny SWE task built on the spot: `add()` subtracts; the hidden test checks 2 + 3.

Its pytest.ini is the caller's, so one copy of the task can have a test setup that never runs its tests.
"""

from __future__ import annotations

from pathlib import Path

from envhub.envs.swe.repos import git
from envhub.envs.swe.tasks import SWEInstance

BROKEN_SETUP = "[pytest]\naddopts = --cov=calc\n"  # pytest-cov's option; the sandbox image has no pytest-cov
WORKING_SETUP = "[pytest]\naddopts = -q\n"
BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\n\ndef test_zero():\n    assert add(1, 0) == 1\n"
NEW_TEST = "\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def diff(repo: Path, path: str, text: str) -> str:
    """The diff that writes `text` to `path`, leaving the repository as it was."""
    before = (repo / path).read_text()
    (repo / path).write_text(text)
    patch = git(repo, "diff")
    (repo / path).write_text(before)
    return patch


def tiny_instance(repos_dir: Path, name: str, pytest_ini: str, conftest: str = "") -> SWEInstance:
    """The task in a new git repository `repos_dir/tiny__NAME` whose pytest.ini is `pytest_ini` (and conftest.py
    `conftest`, when given)."""
    repo = repos_dir / f"tiny__{name}"
    repo.mkdir()
    (repo / "tests").mkdir()
    (repo / "calc.py").write_text(BUGGY)
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    (repo / "pytest.ini").write_text(pytest_ini)
    if conftest:
        (repo / "conftest.py").write_text(conftest)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    return SWEInstance(
        instance_id=f"tiny__{name}-1",
        repo=f"tiny/{name}",
        base_commit=git(repo, "rev-parse", "HEAD").strip(),
        problem_statement="add() subtracts.",
        patch=diff(repo, "calc.py", BUGGY.replace("a - b", "a + b")),
        test_patch=diff(repo, "tests/test_calc.py", TESTS + NEW_TEST),
        FAIL_TO_PASS=("tests/test_calc.py::test_add",),
        PASS_TO_PASS=("tests/test_calc.py::test_zero",),
    )
