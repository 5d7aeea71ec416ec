"""Build the bundled task set: git repositories with fixed history, and their SWE-bench instances.

Each project under `data/projects/<owner__name>/` holds `base/` (the fixed library and its visible
tests) and `tasks.toml` (per task: a problem statement, the bug as text replacements that turn the
fixed files into the buggy ones, and hidden tests appended to one test file). The builder writes one
git repository per project through `git fast-import` with fixed names and dates, so every commit
hash is the same on every machine:

    main                  the fixed library ("Initial import")
    refs/envhub/task-N    main + bug N           (the instance's base_commit)
    refs/envhub/tests-N   task-N + hidden tests  (the instance's test_patch is the diff to it)

`patch` is `git diff task-N main`, i.e. the gold fix. Repositories are cached under
`$ENVHUB_CACHE/swe-repos/<content hash>/` and rebuilt only when the project files change.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from envhub.envs.swe.tasks import SWEInstance
from envhub.errors import ConfigError

PROJECTS_DIR = Path(__file__).parent / "data" / "projects"
BUILDER_VERSION = "1"
_IDENTITY = "envhub <tasks@envhub.invalid> 1704067200 +0000"
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "envhub",
    "GIT_AUTHOR_EMAIL": "tasks@envhub.invalid",
    "GIT_AUTHOR_DATE": "1704067200 +0000",
    "GIT_COMMITTER_NAME": "envhub",
    "GIT_COMMITTER_EMAIL": "tasks@envhub.invalid",
    "GIT_COMMITTER_DATE": "1704067200 +0000",
    "LC_ALL": "C",
}


@dataclass(frozen=True)
class BugSpec:
    """One bundled task: how to break the fixed project, what the user reports, which tests catch it."""

    number: int
    problem_statement: str
    replacements: tuple[tuple[str, str, str], ...]  # (file, fixed text, buggy text)
    tests_file: str
    hidden_tests: str


@dataclass(frozen=True)
class Project:
    """A bundled project: its fixed files and its tasks."""

    name: str  # owner__name
    files: dict[str, bytes]
    bugs: tuple[BugSpec, ...]

    @property
    def repo(self) -> str:
        return self.name.replace("__", "/", 1)


def load_project(directory: Path) -> Project:
    """Read one project directory (base/ and tasks.toml)."""
    base = directory / "base"
    files = {
        p.relative_to(base).as_posix(): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }
    spec = tomllib.loads((directory / "tasks.toml").read_text(encoding="utf-8"))
    bugs = tuple(
        BugSpec(
            number=int(task["number"]),
            problem_statement=task["problem_statement"].strip() + "\n",
            replacements=tuple((b["file"], b["fixed"], b["buggy"]) for b in task["bug"]),
            tests_file=task["tests_file"],
            hidden_tests=task["hidden_tests"],
        )
        for task in spec["task"]
    )
    return Project(directory.name, files, bugs)


def load_projects(projects_dir: Path = PROJECTS_DIR) -> list[Project]:
    """Every bundled project, sorted by name."""
    return [load_project(d) for d in sorted(projects_dir.iterdir()) if (d / "tasks.toml").is_file()]


def buggy_files(project: Project, bug: BugSpec) -> dict[str, bytes]:
    """The project's files with bug `bug` applied; each fixed snippet must occur exactly once."""
    files = dict(project.files)
    for path, fixed, buggy in bug.replacements:
        text = files[path].decode("utf-8")
        if text.count(fixed) != 1:
            raise ConfigError(
                f"{project.name} task {bug.number}: the fixed snippet occurs {text.count(fixed)} times in {path}, "
                f"expected once"
            )
        files[path] = text.replace(fixed, buggy).encode("utf-8")
    return files


def _fast_import_stream(project: Project) -> bytes:
    chunks: list[bytes] = []

    def commit(ref: str, mark: int, message: str, parent: int | None, files: dict[str, bytes]) -> None:
        msg = message.encode()
        chunks.append(
            f"commit {ref}\nmark :{mark}\nauthor {_IDENTITY}\ncommitter {_IDENTITY}\ndata {len(msg)}\n".encode()
            + msg
            + b"\n"
        )
        if parent is not None:
            chunks.append(f"from :{parent}\n".encode())
        for path, data in sorted(files.items()):
            chunks.append(f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n")
        chunks.append(b"\n")

    commit("refs/heads/main", 1, f"Initial import of {project.repo}", None, project.files)
    for index, bug in enumerate(project.bugs):
        broken = buggy_files(project, bug)
        changed = {p: d for p, d in broken.items() if project.files[p] != d}
        commit(f"refs/envhub/task-{bug.number}", 2 * index + 2, f"Update {', '.join(sorted(changed))}", 1, changed)
        tests = broken[bug.tests_file] + bug.hidden_tests.encode("utf-8")
        commit(
            f"refs/envhub/tests-{bug.number}",
            2 * index + 3,
            f"Add regression tests for task {bug.number}",
            2 * index + 2,
            {bug.tests_file: tests},
        )
    return b"".join(chunks)


def git(repo: Path, *args: str, input: bytes | None = None) -> str:
    """Run git in `repo` with envhub's fixed identity and no user config; returns stdout."""
    result = subprocess.run(
        ["git", "-C", str(repo), *args], input=input, capture_output=True, env={**os.environ, **GIT_ENV}
    )
    if result.returncode != 0:
        raise ConfigError(
            f"git {' '.join(args[:2])} failed in {repo}: {result.stderr.decode(errors='replace').strip()}"
        )
    return result.stdout.decode("utf-8", errors="replace")


def build_repo(project: Project, target: Path) -> None:
    """Write `project` as a git repository at `target` (deterministic hashes)."""
    target.mkdir(parents=True)
    git(target, "init", "-q", "-b", "main")
    git(target, "fast-import", "--quiet", "--done", input=_fast_import_stream(project) + b"done\n")
    git(target, "checkout", "-q", "main")


def content_hash(projects_dir: Path = PROJECTS_DIR) -> str:
    """A hash of every project file and the builder version: the cache key of the built repos."""
    digest = hashlib.sha256(BUILDER_VERSION.encode())
    for path in sorted(p for p in projects_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(projects_dir).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """envhub's cache directory ($ENVHUB_CACHE, default ~/.cache/envhub)."""
    return Path(os.environ.get("ENVHUB_CACHE") or Path.home() / ".cache" / "envhub")


def build_bundled_repos(cache_dir: Path | None = None, projects_dir: Path = PROJECTS_DIR) -> Path:
    """Build (once) the bundled repositories; returns the repos_dir holding owner__name repos."""
    root = (cache_dir or cache_root()) / "swe-repos"
    target = root / content_hash(projects_dir)
    if (target / ".complete").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        scratch = root / f".building-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        for project in load_projects(projects_dir):
            build_repo(project, scratch / project.name)
        (scratch / ".complete").write_text("ok\n")
        shutil.rmtree(target, ignore_errors=True)
        scratch.rename(target)
    return target


def test_ids(source: str, path: str) -> list[str]:
    """pytest node ids of the test functions (and Test* class methods) defined in `source`."""
    ids = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            ids.append(f"{path}::{node.name}")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            ids += [
                f"{path}::{node.name}::{m.name}"
                for m in node.body
                if isinstance(m, ast.FunctionDef) and m.name.startswith("test")
            ]
    return ids


def project_instances(project: Project, repo_dir: Path) -> list[SWEInstance]:
    """The SWE-bench instances of one built project."""
    visible = [
        tid
        for path, data in sorted(project.files.items())
        if path.startswith("tests/") and path.endswith(".py")
        for tid in test_ids(data.decode("utf-8"), path)
    ]
    instances = []
    for bug in project.bugs:
        base = git(repo_dir, "rev-parse", f"refs/envhub/task-{bug.number}").strip()
        instances.append(
            SWEInstance(
                instance_id=f"{project.name}-{bug.number}",
                repo=project.repo,
                base_commit=base,
                problem_statement=bug.problem_statement,
                patch=git(repo_dir, "diff", base, "refs/heads/main"),
                test_patch=git(repo_dir, "diff", base, f"refs/envhub/tests-{bug.number}"),
                FAIL_TO_PASS=tuple(test_ids(bug.hidden_tests, bug.tests_file)),
                PASS_TO_PASS=tuple(visible),
            )
        )
    return instances


def bundled_instances(repos_dir: Path | None = None) -> list[SWEInstance]:
    """Generate the bundled instances from the built repositories (the source of data/tasks.jsonl)."""
    repos_dir = repos_dir or build_bundled_repos()
    return [inst for project in load_projects() for inst in project_instances(project, repos_dir / project.name)]
