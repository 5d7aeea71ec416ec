"""Where an episode's repository comes from: the instance's own image (repo at /testbed) or `repos_dir`.

Instances with an `image` run in a sandbox of that image, laid out as the published images are (repo at
`workdir`, its own Python environment); everything else gets the bundled base image with the repository
copied in from `repos_dir` at base_commit (`grading.load_repo`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import AsyncIterator
from typing import Any

from envhub.envs.swe import grading
from envhub.envs.swe.tasks import SWEInstance
from envhub.errors import ConfigError
from envhub.sandboxes.base import ImageLayout

# The published images keep their Python environment here; it goes first on PATH so `python` and `pytest`
# in the agent's shell are the project's, as after `conda activate testbed`.
CONDA_ENV = ("/opt/miniconda3/envs/testbed/bin", "/opt/miniconda3/bin")
ENV_PATHS = {
    "swebench": CONDA_ENV,
    "swegym": CONDA_ENV,
    "swesmith": CONDA_ENV,
    "r2egym": ("/root/.venv/bin", "/root/.local/bin"),
}
CLEAN_TAG = "envhub-clean"  # SWE-smith: the image's clean commit, whose test files grading restores
_pools: dict[tuple[Any, ...], Any] = {}


def layout(instance: SWEInstance) -> ImageLayout | None:
    """How to run the instance's image (None: the base image with the repo from repos_dir)."""
    if not instance.image:
        return None
    return ImageLayout(path_prefix=ENV_PATHS.get(instance.dataset, ()))


def repo_dir(sandbox: Any, instance: SWEInstance | None) -> str:
    """The repository's directory inside the sandbox."""
    if instance is not None and instance.image:
        return instance.workdir or "/testbed"
    return grading.repo_dir(sandbox)


def shared_pools(
    backend: str = "docker", image: str | None = None, *, spares_budget: int = 8, max_in_use: int = 16
) -> Any:
    """The process-wide `MultiImagePool` on the running event loop (created lazily)."""
    from envhub.sandboxes.multipool import MultiImagePool

    key = (backend, image, id(asyncio.get_running_loop()))
    if key not in _pools:
        _pools[key] = MultiImagePool(backend, spares_budget=spares_budget, max_in_use=max_in_use, default_image=image)
    return _pools[key]


@contextlib.asynccontextmanager
async def acquire(pool: Any, instance: SWEInstance) -> AsyncIterator[Any]:
    """A fresh sandbox for `instance`: of its own image from a `MultiImagePool`, else from any pool."""
    from envhub.sandboxes.multipool import MultiImagePool

    if isinstance(pool, MultiImagePool):
        async with pool.acquire(instance.image, layout(instance)) as sandbox:
            yield sandbox
        return
    if instance.image and getattr(pool, "image", None) != instance.image:
        raise ConfigError(
            f"instance {instance.instance_id} needs its own image {instance.image}, but a single-image pool was given",
            hint="pass a sandboxes.multipool.MultiImagePool (or no pool) for task sets with per-instance images",
        )
    async with pool.acquire() as sandbox:
        yield sandbox


async def prepare(sandbox: Any, instance: SWEInstance, repos_dir: Any) -> str:
    """Put the repository in its starting state; returns the commit the agent's diff is taken against."""
    if not instance.image:
        return await grading.load_repo(sandbox, instance, repos_dir)
    steps = []
    if instance.dataset == "swesmith":
        # SWE-smith images hold the clean repo; the bug lives on a branch named after the instance, or in `bug_patch`.
        branch = shlex.quote(instance.instance_id)
        bug = instance.extra.get("bug_patch", "")
        steps.append(f"git tag -f {CLEAN_TAG} HEAD >/dev/null")  # grading restores the test files from here
        steps.append(
            f"if git rev-parse -q --verify refs/heads/{branch} >/dev/null; then git checkout -q {branch}; "
            f"else printf %s {shlex.quote(bug)} | git apply --whitespace=nowarn - && git add -A && git commit -q "
            f"--no-verify -m bug; fi"
        )
    steps.append("git rev-parse HEAD")
    result = await sandbox.exec(
        " && ".join(steps), timeout=120, cwd=repo_dir(sandbox, instance), env=grading.GIT_IDENTITY
    )
    if result.exit_code != 0:
        raise grading.RepoError(
            f"cannot set up {instance.instance_id} in {instance.image}: "
            f"{(result.stderr or result.stdout).strip()[-300:]}",
            hint=f"check that the image keeps a git repository at {repo_dir(sandbox, instance)}",
        )
    return result.stdout.strip().splitlines()[-1]
