"""Published SWE task sets as they are distributed: SWE-bench (Lite / Verified), SWE-Gym, R2E-Gym, SWE-smith.

    load_tasks("princeton-nlp/SWE-bench_Verified")        # from the Hugging Face hub (online, `datasets`)
    load_tasks("swe_gym.parquet")                          # a local parquet or JSONL / JSON file
    load_tasks("rows.jsonl", dataset="r2egym")             # force the format instead of detecting it

Every row becomes one `SWEInstance` whose `dataset` names the format, whose `image` is the instance's own
image (the dataset's field, or its naming scheme) and whose `workdir` is where that image keeps the repo.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from envhub.envs.swe.tasks import REQUIRED_FIELDS, SWEInstance, instance_from_dict, load_instances
from envhub.errors import ConfigError

FORMATS = ("swebench", "swegym", "r2egym", "swesmith", "envhub")
TESTBED = "/testbed"
# Hub names seen in the wild -> (format, default split)
KNOWN_HUB_SETS = {
    "princeton-nlp/swe-bench": ("swebench", "test"),
    "princeton-nlp/swe-bench_lite": ("swebench", "test"),
    "princeton-nlp/swe-bench_verified": ("swebench", "test"),
    "swe-bench/swe-bench": ("swebench", "test"),
    "swe-bench/swe-bench_lite": ("swebench", "test"),
    "swe-bench/swe-bench_verified": ("swebench", "test"),
    "swe-gym/swe-gym": ("swegym", "train"),
    "swe-gym/swe-gym-lite": ("swegym", "train"),
    "r2e-gym/r2e-gym-lite": ("r2egym", "train"),
    "r2e-gym/r2e-gym-subset": ("r2egym", "train"),
    "r2e-gym/r2e-gym-v1": ("r2egym", "train"),
    "swe-bench/swe-smith": ("swesmith", "train"),
    "swe-bench/swe-smith-py": ("swesmith", "train"),
}


def swebench_image(instance_id: str, namespace: str = "swebench") -> str:
    """SWE-bench's published eval image: `swebench/sweb.eval.x86_64.<id, __ -> _1776_>:latest`."""
    return f"{namespace}/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()


def swegym_image(instance_id: str) -> str:
    """SWE-Gym's published image (OpenHands' naming): `xingyaoww/sweb.eval.x86_64.<id, __ -> _s_>:latest`."""
    return f"xingyaoww/sweb.eval.x86_64.{instance_id.replace('__', '_s_')}:latest".lower()


def swesmith_image(name: str) -> str:
    """SWE-smith's per-repo image from its `image_name` or `repo` (`owner__name.commit8`)."""
    name = name.split("/", 1)[1] if name.startswith("swesmith/") else name
    if "/" not in name:
        name = "jyangballin/" + (name if name.startswith("swesmith.") else f"swesmith.x86_64.{name}")
    repo, _, tag = name.partition(":")
    return f"{repo.replace('__', '_1776_')}:{tag or 'latest'}".lower()


def detect_format(row: dict[str, Any]) -> str:
    """The published format a row is in, from its fields."""
    if row.get("dataset") in FORMATS:
        return "envhub"  # already in envhub's own form (written by `write_instances`)
    if "docker_image" in row and ("repo_name" in row or "expected_output_json" in row):
        return "r2egym"
    if "image_name" in row or str(row.get("repo", "")).startswith("swesmith/"):
        return "swesmith"
    if "version" in row or "environment_setup_commit" in row:
        return "swebench"
    return "envhub"


def _text(row: dict[str, Any], key: str, default: str = "") -> str:
    value = row.get(key, default)
    return default if value is None else str(value)


def _tests(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"a FAIL_TO_PASS / PASS_TO_PASS value is not a JSON list ({exc.msg}): {value[:80]!r}"
            ) from None
    if not isinstance(value, (list, tuple)) and not hasattr(value, "tolist"):
        raise ConfigError(f"FAIL_TO_PASS / PASS_TO_PASS must be lists of test ids, got {type(value).__name__}")
    return [str(v) for v in value]  # lists, and numpy arrays from parquet


def from_swebench(row: dict[str, Any], *, fmt: str = "swebench", with_image: bool = True) -> SWEInstance:
    """A SWE-bench / SWE-Gym row (test lists as JSON strings or lists) as an instance in its own image."""
    iid = _text(row, "instance_id")
    image = (
        row.get("image")
        or row.get("docker_image")
        or ((swegym_image(iid) if fmt == "swegym" else swebench_image(iid)) if with_image else None)
    )
    normal = {k: row[k] for k in REQUIRED_FIELDS if k in row}
    normal.update(FAIL_TO_PASS=_tests(row.get("FAIL_TO_PASS")), PASS_TO_PASS=_tests(row.get("PASS_TO_PASS")))
    extra = {k: v for k, v in row.items() if k not in normal and k not in ("image", "docker_image")}
    normal.update(
        extra,
        dataset=fmt,
        version=_text(row, "version") or None,
        environment_setup_commit=_text(row, "environment_setup_commit") or None,
        image=image,
        workdir=TESTBED if image else None,
    )
    return instance_from_dict(normal, f"{fmt} instance {iid or '?'}")


def _is_test_path(path: str) -> bool:
    parts = path.split("/")
    return (
        path.endswith("_test.py")
        or parts[-1].startswith("test_")
        or bool({"tests", "Tests", "test", "Test"} & set(parts[:-1]))
    )


def r2egym_gold_patch(parsed_commit: str | dict[str, Any]) -> str:
    """The fix as a unified diff, rebuilt from R2E-Gym's `parsed_commit_content` (its non-test file diffs)."""
    commit = json.loads(parsed_commit) if isinstance(parsed_commit, str) else parsed_commit
    marks = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}
    out = []
    for diff in commit.get("file_diffs", []):
        path = diff["header"]["file"]["path"]
        if _is_test_path(path):
            continue
        out.append(f"diff --git a/{path} b/{path}\n")
        if diff["header"].get("misc_line"):
            out.append(diff["header"]["misc_line"] + "\n")
        if index := diff.get("index_line"):
            mode = f" {index['mode']}" if index.get("mode") else ""
            out.append(f"index {index['old_commit_hash']}..{index['new_commit_hash']}{mode}\n")
        if diff.get("is_binary_file"):
            out.append(f"{diff.get('binary_line') or ''}\n")
        if diff.get("minus_file") and diff.get("plus_file"):
            out.append(f"--- {diff['minus_file']['path']}\n+++ {diff['plus_file']['path']}\n")
        for hunk in diff.get("hunks", []):
            d = hunk["descriptor"]
            span = lambda r: f"{r['start']}" if r.get("length") is None else f"{r['start']},{r['length']}"
            out.append(
                f"@@ -{span(d['old_range'])} +{span(d['new_range'])} @@"
                + (f" {d['section']}" if d.get("section") else "")
                + "\n"
            )
            out += [f"{marks[line['type']]}{line['content']}\n" for line in hunk["line_group"]["all_lines"]]
    return "".join(out)


def from_r2egym(row: dict[str, Any]) -> SWEInstance:
    """An R2E-Gym row: its `docker_image` holds the repo at /testbed and the hidden tests at /r2e_tests;
    graded by comparing each test's status with `expected_output_json`."""
    image = _text(row, "docker_image")
    name = _text(row, "repo_name") or image.rsplit("/", 1)[-1].split(":")[0]
    commit = _text(row, "commit_hash") or image.rpartition(":")[2]
    expected = row.get("expected_output_json") or "{}"
    expected = json.loads(expected) if isinstance(expected, str) else dict(expected)
    iid = _text(row, "instance_id") or f"{name}-{commit[:12]}"
    normal = {
        "instance_id": iid,
        "repo": name if "/" in name else f"r2e-gym/{name}",
        "base_commit": commit,
        "problem_statement": _text(row, "problem_statement"),
        "test_patch": "",
        "FAIL_TO_PASS": [],
        "patch": _text(row, "patch")
        or (r2egym_gold_patch(row["parsed_commit_content"]) if row.get("parsed_commit_content") else ""),
        "PASS_TO_PASS": [t for t, status in expected.items() if status == "PASSED"],
        "dataset": "r2egym",
        "image": image,
        "workdir": TESTBED,
        "expected_output_json": expected,
    }
    normal.update(
        {k: v for k, v in row.items() if k not in normal and k not in ("docker_image", "repo_name", "commit_hash")}
    )
    return instance_from_dict(normal, f"r2egym instance {iid}")


def reverse_patch(patch: str) -> str:
    """The unified diff that undoes `patch` (SWE-smith ships the bug, so its fix is the bug reversed)."""
    lines = patch.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:], lines[i + 1][4:]
            out += ["--- " + _side(new, "a/"), "+++ " + _side(old, "b/")]
            i += 2
            continue
        if line.startswith("@@"):
            line = re.sub(r"^@@ -(\S+) \+(\S+) @@", r"@@ -\2 +\1 @@", line)
        elif line.startswith("new file mode") or line.startswith("deleted file mode"):
            line = (
                line.replace("new file", "\0", 1)
                .replace("deleted file", "new file", 1)
                .replace("\0", "deleted file", 1)
            )
        elif match := re.match(r"index (\w+)\.\.(\w+)(.*)", line, re.S):
            line = f"index {match[2]}..{match[1]}{match[3]}"
        elif line[:1] == "+":
            line = "-" + line[1:]
        elif line[:1] == "-":
            line = "+" + line[1:]
        out.append(line)
        i += 1
    return "".join(out)


def _side(path: str, side: str) -> str:
    return side + path[2:] if path.startswith(("a/", "b/")) else path


def from_swesmith(row: dict[str, Any]) -> SWEInstance:
    """A SWE-smith row: one image per repo with the clean repo at /testbed; `patch` is the bug (the fix is its
    reverse); the episode starts from the instance's branch when the image has it, else from the bug applied."""
    iid = _text(row, "instance_id")
    repo = _text(row, "repo")
    image = swesmith_image(_text(row, "image_name") or repo)
    bug = _text(row, "patch")
    base = _text(row, "base_commit") or repo.rpartition(".")[2]
    normal = {
        "instance_id": iid,
        "repo": repo if "/" in repo else f"swesmith/{repo}",
        "base_commit": base,
        "problem_statement": _text(row, "problem_statement"),
        "patch": reverse_patch(bug),
        "test_patch": "",
        "FAIL_TO_PASS": _tests(row.get("FAIL_TO_PASS")),
        "PASS_TO_PASS": _tests(row.get("PASS_TO_PASS")),
        "dataset": "swesmith",
        "image": image,
        "workdir": TESTBED,
        "bug_patch": bug,
    }
    normal.update({k: v for k, v in row.items() if k not in normal and k not in ("image_name",)})
    return instance_from_dict(normal, f"swesmith instance {iid}")


def convert(row: dict[str, Any], dataset: str | None = None, *, with_image: bool = True) -> SWEInstance:
    """One published row as an `SWEInstance` (format detected unless `dataset` names it)."""
    fmt = dataset or detect_format(row)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown dataset format {fmt!r}", hint="use one of " + ", ".join(FORMATS))
    if fmt in ("swebench", "swegym"):
        return from_swebench(row, fmt=fmt, with_image=with_image)
    if fmt == "r2egym":
        return from_r2egym(row)
    if fmt == "swesmith":
        return from_swesmith(row)
    return instance_from_dict(row)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a local JSONL, JSON list or parquet file."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(f"reading {path} needs pyarrow", hint="pip install 'envhub[swe]'") from None
        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    try:
        if text.lstrip().startswith("["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def hub_rows(name: str, split: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """Rows of a Hugging Face hub data set through `datasets` (its cache works offline once filled)."""
    fmt, default_split = KNOWN_HUB_SETS.get(name.lower(), (None, "test"))
    split = split or default_split
    local = name.replace("/", "__") + f".{split}.jsonl"
    fetch = (
        f"python -c \"from datasets import load_dataset; load_dataset('{name}', split='{split}').to_json('{local}')\""
    )
    try:
        from datasets import load_dataset
    except ImportError:
        raise ConfigError(
            f"loading {name} from the Hugging Face hub needs the `datasets` package",
            hint=f"pip install 'envhub[swe]', or on a machine with network run {fetch} and pass tasks='{local}'",
        ) from None
    try:
        rows = list(load_dataset(name, split=split))
    except Exception as exc:
        raise ConfigError(
            f"cannot load {name} (split {split}) from the Hugging Face hub: {type(exc).__name__}: {str(exc)[:200]}",
            hint=f"offline? on a machine with network run {fetch}, copy {local} here and pass tasks='{local}'",
        ) from None
    return rows, fmt


def load_tasks(
    source: str | Path, *, dataset: str | None = None, split: str | None = None, with_images: bool = True
) -> list[SWEInstance]:
    """Instances from a local file (JSONL / JSON / parquet) or a hub name like `princeton-nlp/SWE-bench_Verified`.

    `with_images=False` keeps SWE-bench rows without an explicit image on `repos_dir` (the base image)."""
    path = Path(source)
    if path.is_file():
        rows = read_rows(path)
        if (
            dataset is None
            and path.suffix in (".jsonl", ".json")
            and rows
            and all(detect_format(r) == "envhub" for r in rows)
        ):
            return load_instances(path)  # envhub's own files keep their line-numbered errors
        hint = dataset or ("swegym" if re.search(r"swe[-_]?gym", path.name, re.I) else None)
    elif re.fullmatch(r"[\w.-]+/[\w.-]+", str(source)) and path.suffix not in (".jsonl", ".json", ".parquet"):
        rows, hint = hub_rows(str(source), split)
        hint = dataset or hint
    else:
        raise ConfigError(
            f"task file {source} does not exist",
            hint="pass a JSONL / JSON / parquet file, a hub name like princeton-nlp/SWE-bench_Verified, or omit tasks "
            "for the bundled set",
        )
    instances = [convert(_plain(row), hint, with_image=with_images) for row in rows]
    _check_unique(instances, str(source))
    return instances


def _plain(row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ConfigError(f"expected a JSON object per task, got {type(row).__name__}")
    return dict(row)


def _check_unique(instances: Iterable[SWEInstance], where: str) -> None:
    seen: set[str] = set()
    for inst in instances:
        if inst.instance_id in seen:
            raise ConfigError(f"{where}: instance_id {inst.instance_id} appears twice")
        seen.add(inst.instance_id)
