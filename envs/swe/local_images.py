"""Build an instance's image locally, laid out as its data set's published images are (no registry needed).

    build_instance_image(instance, repos_dir)   # -> (instance.image, built?)

The image is `FROM` the bundled base image with the repository at `/testbed` (a git repository holding only
history up to base_commit) and its own Python environment, where each data set keeps it:

- SWE-bench / SWE-Gym / SWE-smith: `/opt/miniconda3/envs/testbed` plus `/opt/miniconda3/bin/activate`, so
  the official eval script's `source /opt/miniconda3/bin/activate && conda activate testbed` works;
- R2E-Gym: `/root/.venv`, the hidden tests in `/r2e_tests` and `/root/run_tests.sh`;
- SWE-smith: `/testbed` is the clean repo, the bug is a branch named after the instance.

Published images already hold their hidden tests; a locally built R2E-Gym or SWE-smith image takes them from
the row's `build_test_patch` (a diff adding them on top of base_commit).

The project is installed into that environment as an editable path (a `.pth` entry for /testbed). Images
are labelled `envhub.image` (`envhub sandbox gc --images` removes them) and rebuilt only when their recipe
(instance, repo commit, base image, layout) changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from envhub.envs.swe.grading import files_in_patch, repo_path
from envhub.envs.swe.repos import GIT_ENV, git
from envhub.envs.swe.tasks import SWEInstance
from envhub.errors import ConfigError

LAYOUT_VERSION = "1"
_PYTEST_SHIM = "#!{env}/bin/python\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n"
_ACTIVATE = (
    'conda() { case "$1" in activate) . "/opt/miniconda3/envs/${2:-testbed}/bin/activate" ;; deactivate) '
    'deactivate ;; esac; }\n'
)


def _env_script(env: str) -> str:
    """Shell lines that create a Python environment at `env` with the project at /testbed installed editable."""
    return (
        f"python3 -m venv --without-pip --system-site-packages {env}\n"
        f"echo /testbed > \"$({env}/bin/python -c 'import sysconfig; "
        f"print(sysconfig.get_paths()[\"purelib\"])')/testbed.pth\"\n"
        f"cat > {env}/bin/pytest <<'EOF'\n{_PYTEST_SHIM.format(env=env)}EOF\nchmod 755 {env}/bin/pytest\n"
    )


def setup_script(instance: SWEInstance) -> str:
    """The build step run inside the image (as root, without network)."""
    lines = ["set -eu", "cd /testbed && git update-index -q --refresh >/dev/null || true"]
    if instance.dataset == "r2egym":
        lines.append(_env_script("/root/.venv"))
        lines.append(
            "printf '%s\\n' 'cd /testbed' '/root/.venv/bin/python -m pytest -rA -p no:cacheprovider r2e_tests' > "
            "/root/run_tests.sh"
        )
    else:
        lines.append(_env_script("/opt/miniconda3/envs/testbed"))
        lines.append(f"mkdir -p /opt/miniconda3/bin && cat > /opt/miniconda3/bin/activate <<'EOF'\n{_ACTIVATE}EOF")
    return "\n".join(lines) + "\n"


def recipe_key(instance: SWEInstance, source_commit: str, base: str) -> str:
    """The content hash an image is cached under."""
    recipe = {
        "layout": LAYOUT_VERSION,
        "base": base,
        "source": source_commit,
        "setup": setup_script(instance),
        "instance": instance.to_json(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _tar_tree(root: Path, prefix: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=prefix + path.relative_to(root).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 1704067200
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def _testbed(instance: SWEInstance, source: Path, work: Path) -> dict[str, bytes]:
    """Lay out /testbed (and, for R2E-Gym, /r2e_tests) on the host; returns extra context files."""
    git(work, "init", "-q", "-b", "main")
    git(work, "fetch", "-q", str(source), instance.base_commit)
    git(work, "checkout", "-q", "-B", "main", instance.base_commit)
    extra: dict[str, bytes] = {}
    if instance.dataset == "swesmith":
        # The published layout: the clean repo (fixed code + its tests) on main, the bug on a branch.
        git(work, "apply", "-", input=instance.patch.encode())  # the fix (the bug reversed) on base: the clean code
        hidden = str(instance.extra.get("build_test_patch", ""))
        if hidden.strip():
            git(work, "apply", "-", input=hidden.encode())
        git(work, "add", "-A")
        git(work, "commit", "-q", "--no-verify", "--allow-empty", "-m", "clean")
        git(work, "checkout", "-q", "-b", instance.instance_id)
        git(work, "apply", "-", input=str(instance.extra.get("bug_patch", "")).encode())
        git(work, "commit", "-q", "--no-verify", "-am", "bug")
        git(work, "checkout", "-q", "main")
    elif instance.dataset == "r2egym":
        scratch = work.parent / "tests"
        subprocess.run(
            ["git", "-C", str(work), "worktree", "add", "-q", "--detach", str(scratch)],
            check=True,
            capture_output=True,
            env={**os.environ, **GIT_ENV},
        )
        git(scratch, "apply", "-", input=str(instance.extra.get("build_test_patch", "")).encode())
        for name in files_in_patch(str(instance.extra.get("build_test_patch", ""))):
            extra[f"r2e_tests/{Path(name).name}"] = (scratch / name).read_bytes()
        subprocess.run(
            ["git", "-C", str(work), "worktree", "remove", "--force", str(scratch)], check=True, capture_output=True
        )
    git(work, "gc", "-q", "--prune=now")
    return extra


def build_instance_image(instance: SWEInstance, repos_dir: str | Path, *, base: str | None = None) -> tuple[str, bool]:
    """Build `instance.image` from `repos_dir/owner__name` at base_commit; (tag, whether it was built now)."""
    from envhub.sandboxes.images import build_image, docker_client, ensure_base_image

    if not instance.image:
        raise ConfigError(
            f"instance {instance.instance_id} has no image to build",
            hint="only instances with their own image are built",
        )
    base = base or ensure_base_image()
    source = repo_path(instance, repos_dir)
    source_commit = git(source, "rev-parse", f"{instance.base_commit}^{{commit}}").strip()
    key = recipe_key(instance, source_commit, base)
    try:
        if docker_client().images.get(instance.image).labels.get("envhub.content-hash") == key:
            return instance.image, False
    except Exception:
        pass
    with tempfile.TemporaryDirectory(prefix="envhub-image-") as tmp:
        work = Path(tmp) / "testbed"
        work.mkdir()
        extra = _testbed(instance, source, work)
        files = {"testbed.tar": _tar_tree(work), "setup.sh": setup_script(instance).encode(), **extra}
    copy_tests = "COPY r2e_tests/ /r2e_tests/\n" if instance.dataset == "r2egym" else ""
    files["Dockerfile"] = (
        f"FROM {base}\nUSER 0:0\nADD testbed.tar /testbed/\n{copy_tests}COPY setup.sh /tmp/envhub-setup.sh\n"
        "RUN bash /tmp/envhub-setup.sh && rm /tmp/envhub-setup.sh\nWORKDIR /testbed\n"
    ).encode()
    return build_image(instance.image, files, key=key, labels={"envhub.swe-instance": instance.instance_id[:200]})
