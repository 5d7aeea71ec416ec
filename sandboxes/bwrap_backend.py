"""`BwrapSandbox`: bubblewrap over the local debootstrap rootfs (work in progress)."""

from __future__ import annotations

from envhub.errors import SandboxError
from envhub.sandboxes.base import Sandbox


class BwrapSandbox(Sandbox):
    """Placeholder until the bubblewrap backend lands."""

    def __init__(self, *args, **kwargs) -> None:
        raise SandboxError("the bwrap backend is not available yet", hint="use backend='docker'")


def check_bwrap() -> None:
    """Raise SandboxError when bubblewrap cannot run."""


def remove_orphan_dirs() -> list[str]:
    """Remove workdirs of dead owners."""
    return []
