"""The bundled task set and the SWE-bench instance format (no sandbox needed)."""

import json

import pytest

from envhub.envs.swe.grading import files_in_patch, parse_pytest_report
from envhub.envs.swe.repos import build_bundled_repos, bundled_instances, git, load_projects
from envhub.envs.swe.tasks import BUNDLED_TASKS, instance_from_dict, load_instances, write_instances
from envhub.errors import ConfigError


def test_bundled_set_size_and_shape():
    instances = load_instances(BUNDLED_TASKS)
    assert len(instances) >= 30
    assert len({i.repo for i in instances}) >= 5
    for inst in instances:
        assert inst.FAIL_TO_PASS and inst.PASS_TO_PASS and inst.patch.startswith("diff --git")
        assert files_in_patch(inst.test_patch) and all(t.startswith("tests/") for t in files_in_patch(inst.test_patch))
        assert not any(p.startswith("tests/") for p in files_in_patch(inst.patch)), (
            "the gold patch must not touch tests"
        )
        assert len(inst.problem_statement) > 150


def test_bundled_jsonl_is_reproducible_from_the_package(tmp_path):
    repos_dir = build_bundled_repos(tmp_path)
    out = tmp_path / "tasks.jsonl"
    write_instances(bundled_instances(repos_dir), out)
    assert out.read_text() == BUNDLED_TASKS.read_text(), (
        "regenerate with `envhub swe build --write-jsonl envs/swe/data/tasks.jsonl`"
    )


def test_repositories_have_deterministic_hashes(tmp_path):
    first = build_bundled_repos(tmp_path / "a")
    second = build_bundled_repos(tmp_path / "b")
    for project in load_projects():
        assert git(first / project.name, "rev-parse", "main") == git(second / project.name, "rev-parse", "main")
    assert build_bundled_repos(tmp_path / "a") == first  # cached


def test_test_lists_may_be_json_strings_or_lists():
    row = json.loads(BUNDLED_TASKS.read_text().splitlines()[0])
    as_string = instance_from_dict(row)
    as_list = instance_from_dict(
        {**row, "FAIL_TO_PASS": json.loads(row["FAIL_TO_PASS"]), "PASS_TO_PASS": json.loads(row["PASS_TO_PASS"])}
    )
    assert as_string == as_list and isinstance(as_string.FAIL_TO_PASS, tuple)
    assert as_string.repo_dirname == row["repo"].replace("/", "__")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"patch": None}, "missing field"),
        ({"FAIL_TO_PASS": "[oops"}, "not a JSON list"),
        ({"PASS_TO_PASS": [1]}, "list of pytest node ids"),
        ({"repo": "noslash"}, "owner/name"),
    ],
)
def test_malformed_instances_name_the_problem(change, message):
    row = json.loads(BUNDLED_TASKS.read_text().splitlines()[0])
    row.update(change)
    row = {k: v for k, v in row.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        instance_from_dict(row)


def test_load_reports_file_and_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text(BUNDLED_TASKS.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"t.jsonl:2"):
        load_instances(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_instances(tmp_path / "missing.jsonl")


def test_parse_pytest_report():
    output = """
tests/test_a.py::test_x FAILED
=========================== short test summary info ============================
PASSED tests/test_a.py::test_ok
PASSED tests/test_a.py::TestK::test_m
FAILED tests/test_a.py::test_x - assert 1 == 2
ERROR tests/test_b.py::test_y - RuntimeError: boom
"""
    assert parse_pytest_report(output) == {
        "tests/test_a.py::test_ok": "PASSED",
        "tests/test_a.py::TestK::test_m": "PASSED",
        "tests/test_a.py::test_x": "FAILED",
        "tests/test_b.py::test_y": "ERROR",
    }
