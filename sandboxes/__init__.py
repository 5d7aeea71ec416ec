"""Isolated sandboxes for untrusted model-written commands: Docker and bubblewrap backends and a warm pool
(installed as `envhub.sandboxes` from the top-level `sandboxes/` folder).

from envhub.sandboxes import SandboxPool
async with SandboxPool(backend="docker", size=4) as pool:
    async with pool.acquire() as sb:
        r = await sb.exec("python3 -c 'print(1)'", timeout=10)
"""

from envhub.sandboxes.base import ExecResult, Sandbox, SandboxLimits
from envhub.sandboxes.bwrap_backend import BwrapSandbox
from envhub.sandboxes.docker_backend import DockerSandbox
from envhub.sandboxes.images import (
    base_image_tag,
    build_base_image,
    build_derived_image,
    ensure_base_image,
    ensure_rootfs,
)
from envhub.sandboxes.local import LocalSandbox
from envhub.sandboxes.pool import PoolMetrics, SandboxPool

__all__ = [
    "BwrapSandbox",
    "DockerSandbox",
    "ExecResult",
    "LocalSandbox",
    "PoolMetrics",
    "Sandbox",
    "SandboxLimits",
    "SandboxPool",
    "base_image_tag",
    "build_base_image",
    "build_derived_image",
    "ensure_base_image",
    "ensure_rootfs",
]
