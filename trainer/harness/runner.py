"""Where a harness program runs: inside a fresh bubblewrap sandbox whose only way out is the gateway
(`SandboxedRunner`), or directly on the host for development (`UnsafeLocalRunner`, refused unless asked for).

The sandboxed path works with network-less sandboxes: the gateway also listens on a unix socket created in the
sandbox's own /tmp folder (so bind-mounted into it, and into no other sandbox), and `forward.py`, run by the
sandbox's python3 as the parent of the harness, listens on 127.0.0.1:PORT inside the sandbox's network namespace
and relays to that socket. OPENAI_BASE_URL points at the forwarder; every other address, the host's ports
included, is unreachable because the namespace holds nothing but its own loopback.
"""

from __future__ import annotations

import abc
from importlib import resources

from envhub.errors import HarnessError
from envhub.sandboxes.base import ExecResult, SandboxLimits
from envhub.trainer.gateway import EpisodeHandle, Gateway
from envhub.trainer.gateway.episodes import mcp_url
from envhub.trainer.harness.builtin import Launch

FORWARD_PORT = 8085  #: the forwarder's port inside the sandbox (its own network namespace: no clash between episodes)
_SOCKET, _FORWARDER = "/tmp/.envhub-gateway.sock", "/tmp/.envhub-forward.py"


class HarnessRunner(abc.ABC):
    """Runs one harness command for one episode with the episode's environment; returns what it did."""

    name = ""
    sandboxed = True

    @abc.abstractmethod
    async def run(
        self, gateway: Gateway, handle: EpisodeHandle, launch: Launch, env: dict[str, str], timeout: float
    ) -> ExecResult:
        """Run the launch's command until it exits or `timeout` seconds pass; every resource is released."""


class SandboxedRunner(HarnessRunner):
    """A fresh bubblewrap sandbox per episode, network only to the gateway (through the in-sandbox forwarder).

    A launch's mounts are host folders seen read-only inside (e.g. a harness's packages)."""

    name = "bwrap"

    def __init__(self, *, rootfs: str | None = None, limits: SandboxLimits | None = None) -> None:
        self.rootfs, self.limits = rootfs, limits or SandboxLimits()

    async def run(
        self, gateway: Gateway, handle: EpisodeHandle, launch: Launch, env: dict[str, str], timeout: float
    ) -> ExecResult:
        """Run the command in a new sandbox through the forwarder; the sandbox and the socket go when it ends."""
        from envhub.sandboxes.bwrap_backend import BwrapSandbox

        sandbox = BwrapSandbox(self.rootfs, limits=self.limits, ro_binds=launch.mounts)
        await sandbox.start()
        try:
            forwarder = resources.files("envhub.trainer.harness").joinpath("forward.py").read_bytes()
            for path, data in {_FORWARDER: forwarder, **launch.files}.items():
                await sandbox.write_file(path, data)
            site = await gateway.listen_unix(str(sandbox.root / "tmp" / _SOCKET.rsplit("/", 1)[1]))
            try:
                inside = {**env, **launch.env, **handle.env(), "OPENAI_BASE_URL": f"http://127.0.0.1:{FORWARD_PORT}/v1"}
                if handle.mcp:
                    inside["ENVHUB_MCP_URL"] = mcp_url(inside["OPENAI_BASE_URL"])
                argv = ["python3", _FORWARDER, _SOCKET, str(FORWARD_PORT), "--", "sh", "-c", launch.command]
                return await sandbox.exec(argv, timeout=timeout, env=inside)
            finally:
                await site.stop()
        finally:
            await sandbox.close()


class UnsafeLocalRunner(HarnessRunner):
    """Runs the harness on the host, unsandboxed, with the gateway's TCP address: development only."""

    name = "local"
    sandboxed = False

    def __init__(self, *, allow_unsafe: bool = False) -> None:
        if not allow_unsafe:
            raise HarnessError(
                "the local harness runner runs the program on this machine without any isolation",
                hint="use the sandboxed runner (runner='bwrap'), or pass allow_unsafe=True for development",
            )

    async def run(
        self, gateway: Gateway, handle: EpisodeHandle, launch: Launch, env: dict[str, str], timeout: float
    ) -> ExecResult:
        """Run the command in a fresh temporary folder on the host; the folder goes when it ends."""
        from envhub.sandboxes.local import LocalSandbox

        async with LocalSandbox(allow_unsafe=True) as sandbox:
            env = {**env, **launch.env, **handle.env()}
            return await sandbox.exec(["sh", "-c", launch.command], timeout=timeout, env=env)


def make_runner(runner: str | HarnessRunner, *, allow_unsafe: bool = False, **options) -> HarnessRunner:
    """A runner by name (`bwrap`, `local`) or the runner given."""
    if isinstance(runner, HarnessRunner):
        return runner
    if runner == "bwrap":
        return SandboxedRunner(**options)
    if runner == "local":
        return UnsafeLocalRunner(allow_unsafe=allow_unsafe)
    raise HarnessError(f"unknown harness runner {runner!r}", hint="use 'bwrap' (sandboxed) or 'local' (unsafe)")
