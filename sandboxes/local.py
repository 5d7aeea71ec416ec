"""`LocalSandbox`: commands run directly on the host in a temporary directory. No isolation at all.

For development only; it must be asked for explicitly with `allow_unsafe=True`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

from envhub.errors import SandboxError
from envhub.sandboxes.base import WORKDIR, ExecResult, Sandbox, SandboxLimits
from envhub.sandboxes.process import run_process


class LocalSandbox(Sandbox):
    """Runs commands as the current user in a fresh temp directory (its `workdir`); not a security boundary."""

    def __init__(self, *, limits: SandboxLimits | None = None, allow_unsafe: bool = False) -> None:
        if not allow_unsafe:
            raise SandboxError(
                "LocalSandbox runs untrusted commands without isolation",
                hint="pass allow_unsafe=True for development, or use backend='docker'/'bwrap'",
            )
        self.limits = limits or SandboxLimits()
        self.workdir = ""

    async def start(self) -> None:
        """Create the temporary working directory."""
        self.workdir = await asyncio.to_thread(tempfile.mkdtemp, prefix="envhub-local-")

    async def _run(
        self, argv: list[str], *, timeout: float, stdin: bytes | None, cwd: str, env: dict[str, str], max_output: int
    ) -> ExecResult:
        if not self.workdir:
            raise SandboxError("sandbox is not running", hint="use it through SandboxPool.acquire() or `async with`")
        if cwd == WORKDIR or cwd.startswith(WORKDIR + "/"):
            cwd = self.workdir + cwd[len(WORKDIR) :]
        environment = {**os.environ, "HOME": self.workdir, **env}
        return await run_process(argv, timeout=timeout, stdin=stdin, max_output=max_output, env=environment, cwd=cwd)

    async def reset(self) -> None:
        """Empty the working directory."""
        await asyncio.to_thread(shutil.rmtree, self.workdir, True)
        await asyncio.to_thread(os.makedirs, self.workdir, exist_ok=True)

    async def close(self) -> None:
        """Delete the working directory."""
        if self.workdir:
            await asyncio.to_thread(shutil.rmtree, self.workdir, True)
            self.workdir = ""
