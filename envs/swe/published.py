"""Write envhub instances as rows of the published formats (SWE-bench, SWE-Gym, R2E-Gym, SWE-smith).

Used to exercise every format offline with the bundled projects: `row = published_row(instance, "r2egym")`
gives what that data set would ship for the same bug, and `local_images.build_instance_image` builds its image.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envhub.envs.swe.datasets import reverse_patch
from envhub.envs.swe.grading import files_in_patch
from envhub.envs.swe.tasks import SWEInstance
from envhub.errors import ConfigError


def published_row(
    instance: SWEInstance,
    fmt: str,
    *,
    repo: str | None = None,
    version: str | None = None,
    instance_id: str | None = None,
) -> dict[str, Any]:
    """`instance` as one row of data set `fmt`; `repo` / `version` / `instance_id` rename it (e.g. to a repo
    the swebench package knows, so its official harness grades it)."""
    repo = repo or instance.repo
    owner, name = repo.split("/", 1)
    iid = instance_id or f"{owner}__{name}-{instance.instance_id.rsplit('-', 1)[-1]}"
    if fmt in ("swebench", "swegym"):
        row = {k: v for k, v in instance.to_json().items() if k not in ("dataset", "image", "workdir", "test_cmd")}
        # as in SWE-bench, PASS_TO_PASS holds the tests of the files the test command runs (those the test patch
        # touches)
        hidden = _hidden_test_ids(instance)
        row.update(
            instance_id=iid,
            repo=repo,
            version=version or "0.1",
            environment_setup_commit=instance.base_commit,
            hints_text="",
            created_at="2024-01-01T00:00:00Z",
            PASS_TO_PASS=json.dumps(hidden[len(instance.FAIL_TO_PASS) :]),
        )
        return row
    if fmt == "r2egym":
        hidden = _hidden_test_ids(instance)
        expected = {f"r2e_tests/{Path(t.split('::', 1)[0]).name}::{t.split('::', 1)[1]}": "PASSED" for t in hidden}
        return {
            "repo_name": name,
            "docker_image": f"envhub-local/r2e.{name}:{instance.base_commit[:12]}",
            "commit_hash": instance.base_commit,
            "problem_statement": instance.problem_statement,
            "parsed_commit_content": json.dumps(parsed_commit(instance.patch)),
            "expected_output_json": json.dumps(expected),
            "build_test_patch": instance.test_patch,
        }
    if fmt == "swesmith":
        short = instance.base_commit[:8]
        return {
            "instance_id": instance_id or f"{owner}__{name}.{short}.envhub__{instance.instance_id.rsplit('-', 1)[-1]}",
            "repo": f"swesmith/{owner}__{name}.{short}",
            "image_name": f"swesmith.x86_64.{owner}__{name}.{short}",
            "base_commit": instance.base_commit,
            "patch": reverse_patch(instance.patch),
            "problem_statement": instance.problem_statement,
            "FAIL_TO_PASS": list(instance.FAIL_TO_PASS),
            "PASS_TO_PASS": list(_hidden_test_ids(instance)[len(instance.FAIL_TO_PASS) :]),
            "build_test_patch": instance.test_patch,
        }
    raise ConfigError(f"unknown published format {fmt!r}", hint="use swebench, swegym, r2egym or swesmith")


def _hidden_test_ids(instance: SWEInstance) -> list[str]:
    """FAIL_TO_PASS, then the PASS_TO_PASS tests that live in the files the test patch touches."""
    files = set(files_in_patch(instance.test_patch))
    return list(instance.FAIL_TO_PASS) + [t for t in instance.PASS_TO_PASS if t.split("::", 1)[0] in files]


def parsed_commit(patch: str) -> dict[str, Any]:
    """A unified diff in R2E-Gym's `parsed_commit_content` structure (file diffs, hunks, typed lines)."""
    files: list[dict[str, Any]] = []
    kinds = {" ": "context", "+": "added", "-": "deleted", "\\": "note"}
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            path = line.split(" b/", 1)[1]
            files.append({"header": {"file": {"path": path}, "misc_line": None}, "index_line": None, "hunks": []})
        elif line.startswith("index ") and files and not files[-1]["hunks"]:
            old, _, rest = line[6:].partition("..")
            new, _, mode = rest.partition(" ")
            files[-1]["index_line"] = {"old_commit_hash": old, "new_commit_hash": new, "mode": mode}
        elif line.startswith("--- ") and files and not files[-1]["hunks"]:
            files[-1]["minus_file"] = {"path": line[4:]}
        elif line.startswith("+++ ") and files and not files[-1]["hunks"]:
            files[-1]["plus_file"] = {"path": line[4:]}
        elif line.startswith("@@"):
            head, _, section = line[3:].partition(" @@")
            old, new = (dict(zip(("start", "length"), (int(x) for x in r[1:].split(",")))) for r in head.split())
            files[-1]["hunks"].append(
                {
                    "descriptor": {"old_range": old, "new_range": new, "section": section.strip()},
                    "line_group": {"all_lines": []},
                }
            )
        elif files and files[-1]["hunks"] and line[:1] in kinds:
            mark = "\\" if line.startswith("\\") else line[:1]
            content = line[2:] if mark == "\\" else line[1:]
            files[-1]["hunks"][-1]["line_group"]["all_lines"].append({"content": content, "type": kinds[mark]})
    return {
        "file_diffs": files,
        "old_commit_hash": "",
        "new_commit_hash": "",
        "commit_message": "",
        "commit_date": "2024-01-01T00:00:00",
    }
