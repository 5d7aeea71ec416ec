"""SWE-bench task instances: the dataclass, JSONL loading with field checks, and the bundled set."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError

REQUIRED_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
BUNDLED_TASKS = Path(__file__).parent / "data" / "tasks.jsonl"
OPTIONAL_FIELDS = ("image", "test_cmd", "dataset", "version", "environment_setup_commit", "workdir")
DEFAULT_TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"


@dataclass(frozen=True)
class SWEInstance:
    """One SWE-bench task: a repository at `base_commit`, an issue, the gold fix and the hidden tests."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    image: str | None = None
    test_cmd: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    dataset: str = "envhub"  # the published format it came from: swebench, swegym, r2egym, swesmith, envhub
    version: str | None = None  # SWE-bench's repo version (selects the official harness's test command)
    environment_setup_commit: str | None = None
    workdir: str | None = None  # where the repository lives inside `image` (/testbed for the published sets)

    @property
    def repo_dirname(self) -> str:
        """The directory name of the repository in a repos_dir: 'owner/name' -> 'owner__name'."""
        return self.repo.replace("/", "__")

    @property
    def tests(self) -> tuple[str, ...]:
        """Every test that must pass for the instance to count as resolved."""
        return self.FAIL_TO_PASS + self.PASS_TO_PASS

    def to_json(self) -> dict[str, Any]:
        """The SWE-bench JSON form (test lists as JSON strings, like the published datasets)."""
        row = {k: v for k, v in asdict(self).items() if k in REQUIRED_FIELDS}
        row["FAIL_TO_PASS"] = json.dumps(list(self.FAIL_TO_PASS))
        row["PASS_TO_PASS"] = json.dumps(list(self.PASS_TO_PASS))
        for key in OPTIONAL_FIELDS:
            if getattr(self, key) and not (key == "dataset" and self.dataset == "envhub"):
                row[key] = getattr(self, key)
        return {**row, **self.extra}


def _test_list(value: Any, name: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: {name} is not a JSON list ({exc.msg})") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {name} must be a list of pytest node ids (strings)")
    return tuple(value)


def instance_from_dict(row: dict[str, Any], where: str = "instance") -> SWEInstance:
    """Build an instance from one JSON object, naming the first missing or malformed field."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in REQUIRED_FIELDS if k not in row]
    if missing:
        raise ConfigError(
            f"{where}: missing field(s) {', '.join(missing)}",
            hint="SWE-bench instances need " + ", ".join(REQUIRED_FIELDS),
        )
    for key in REQUIRED_FIELDS[:6]:
        if not isinstance(row[key], str):
            raise ConfigError(f"{where}: field {key} must be a string")
    if "/" not in row["repo"]:
        raise ConfigError(f"{where}: repo {row['repo']!r} should look like 'owner/name'")
    known = set(REQUIRED_FIELDS) | set(OPTIONAL_FIELDS)
    for key in OPTIONAL_FIELDS:
        if row.get(key) is not None and not isinstance(row[key], str):
            raise ConfigError(f"{where}: field {key} must be a string")
    return SWEInstance(
        instance_id=row["instance_id"],
        repo=row["repo"],
        base_commit=row["base_commit"],
        problem_statement=row["problem_statement"],
        patch=row["patch"],
        test_patch=row["test_patch"],
        FAIL_TO_PASS=_test_list(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where),
        PASS_TO_PASS=_test_list(row["PASS_TO_PASS"], "PASS_TO_PASS", where),
        image=row.get("image") or None,
        test_cmd=row.get("test_cmd") or None,
        extra={k: v for k, v in row.items() if k not in known},
        dataset=row.get("dataset") or "envhub",
        version=row.get("version") or None,
        environment_setup_commit=row.get("environment_setup_commit") or None,
        workdir=row.get("workdir") or None,
    )


def load_instances(path: str | Path) -> list[SWEInstance]:
    """Read a JSONL (or JSON list) file of SWE-bench instances; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"task file {path} does not exist",
            hint="pass a JSONL file of SWE-bench instances, or omit tasks for the bundled set",
        )
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        instances = [instance_from_dict(r, f"{path} item {i}") for i, r in enumerate(rows, 1)]
    else:
        instances = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            instances.append(instance_from_dict(row, f"{path}:{number}"))
    seen: set[str] = set()
    for inst in instances:
        if inst.instance_id in seen:
            raise ConfigError(f"{path}: instance_id {inst.instance_id} appears twice")
        seen.add(inst.instance_id)
    return instances


def write_instances(instances: list[SWEInstance], path: str | Path) -> None:
    """Write instances as SWE-bench JSONL, one per line, keys sorted so the file is reproducible."""
    lines = [json.dumps(inst.to_json(), sort_keys=True, ensure_ascii=False) for inst in instances]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
