"""Pytest fixtures for sandbox pools, shared by every test suite (`pytest_plugins` in tests/conftest.py).

Docker is required, not optional, when ENVHUB_REQUIRE_DOCKER=1 (set by `make test`): a missing
engine or base image then fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil

import pytest

from envhub.errors import SandboxError


def docker_required() -> bool:
    """True when tests must fail (not skip) without a Docker engine."""
    return os.environ.get("ENVHUB_REQUIRE_DOCKER", "") not in ("", "0")


def unavailable(reason: str) -> None:
    """Fail when Docker is required, skip otherwise."""
    if docker_required():
        pytest.fail(f"{reason} (ENVHUB_REQUIRE_DOCKER=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def base_image() -> str:
    """The base image tag (built on first use); fails or skips when Docker is unavailable."""
    from envhub.sandboxes.images import ensure_base_image

    try:
        return ensure_base_image()
    except SandboxError as exc:
        unavailable(f"no Docker sandbox: {exc}")
        raise


@pytest.fixture(scope="session")
def base_rootfs() -> str:
    """The base rootfs directory used by the bubblewrap backend (built on first use; no Docker needed)."""
    from envhub.sandboxes.images import ensure_rootfs

    if shutil.which("bwrap") is None:
        unavailable("bubblewrap is not installed (make install)")
    try:
        return str(ensure_rootfs())
    except SandboxError as exc:
        unavailable(f"no bwrap rootfs: {exc}")
        raise


@pytest.fixture
async def docker_pool(base_image: str):
    """A small started Docker sandbox pool (2 warm spares), closed after the test."""
    from envhub.sandboxes import SandboxPool

    async with SandboxPool(backend="docker", image=base_image, size=2, max_size=4) as pool:
        yield pool


@pytest.fixture
async def bwrap_pool(base_rootfs: str):
    """A small started bubblewrap sandbox pool, closed after the test."""
    from envhub.sandboxes import SandboxPool

    async with SandboxPool(backend="bwrap", size=2, max_size=4) as pool:
        yield pool
