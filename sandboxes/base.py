"""The sandbox contract: `Sandbox`, its `ExecResult`, and the `SandboxLimits` every backend enforces."""

from __future__ import annotations

import abc
import io
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 1000
SANDBOX_GID = 1000
WORKDIR = "/workspace"
MAX_FILE_BYTES = 32 * 2**20


@dataclass(frozen=True)
class ExecResult:
    """What one command did: exit code, captured output (capped), and why it stopped."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration: float = 0.0
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0 without timing out."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits applied to every sandbox; the defaults suit one SWE or tool episode."""

    memory_mb: int = 1024
    cpus: float = 1.0
    pids: int = 256
    workdir_mb: int = 256
    tmp_mb: int = 64
    max_output_bytes: int = 1_000_000
    network: bool = False
    cpuset: str = ""  # CPUs the sandbox's processes may run on ("1", "2-3"); "" = any (pins envs apart from engines)


@dataclass(frozen=True)
class ImageLayout:
    """How to run an image that carries its own repository and environment (SWE-bench style, repo at /testbed).

    Such images keep the repo and its environment root-owned and are edited in place, so the root filesystem
    stays writable (the container's own layer, removed with it) and commands run as the image's root user,
    still with every capability dropped, no-new-privileges, no network and the usual limits."""

    writable_root: bool = True
    user: str = "0:0"
    path_prefix: tuple[str, ...] = ()  # prepended to PATH (e.g. the image's venv or conda env bin/)
    home: str = "/root"


class OutputCap:
    """Collects a stream's bytes up to a cap and remembers whether anything was dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.truncated = False

    def feed(self, chunk: bytes) -> None:
        """Keep what fits under the cap; drop the rest."""
        room = self.limit - len(self.buffer)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.buffer += chunk

    def text(self) -> str:
        """The kept bytes as text (invalid UTF-8 replaced)."""
        return self.buffer.decode("utf-8", errors="replace")


class Sandbox(abc.ABC):
    """An isolated place to run an episode's commands; files under /workspace persist between calls."""

    workdir: str = WORKDIR
    limits: SandboxLimits

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float,
        stdin: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run a shell command (or argv list); a timeout kills its processes and sets `timed_out`."""
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        return await self._run(
            shell_command(cmd),
            timeout=timeout,
            stdin=data,
            cwd=cwd or self.workdir,
            env=env or {},
            max_output=self.limits.max_output_bytes,
        )

    @abc.abstractmethod
    async def _run(
        self, argv: list[str], *, timeout: float, stdin: bytes | None, cwd: str, env: dict[str, str], max_output: int
    ) -> ExecResult:
        """Backend hook: run argv as the sandbox user, capping stdout and stderr at `max_output` bytes each."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Create the sandbox's resources (container, rootfs mounts)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Destroy the sandbox and everything it wrote."""

    async def healthy(self) -> bool:
        """True when the sandbox answers a trivial command."""
        try:
            result = await self.exec("true", timeout=10)
        except Exception:
            return False
        return result.exit_code == 0

    async def reset(self) -> None:
        """Remove everything written under the workdir and /tmp, and kill leftover processes."""
        await self.exec(f"find {WORKDIR} /tmp -mindepth 1 -delete 2>/dev/null; true", timeout=30)

    async def read_file(self, path: str) -> bytes:
        """The bytes of a file inside the sandbox; SandboxError when it cannot be read."""
        import base64

        from envhub.errors import SandboxError

        result = await self._run(
            ["base64", "-w0", "--", path],
            timeout=60,
            stdin=None,
            cwd=self.workdir,
            env={},
            max_output=MAX_FILE_BYTES * 4 // 3 + 4,
        )
        if result.exit_code != 0 or result.timed_out:
            raise SandboxError(f"cannot read {path} in the sandbox: {result.stderr.strip() or 'timed out'}")
        if result.truncated:
            raise SandboxError(f"cannot read {path}: larger than {MAX_FILE_BYTES // 2**20} MiB")
        return base64.b64decode(result.stdout)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file inside the sandbox, creating parent directories."""
        from envhub.errors import SandboxError

        payload = data.encode("utf-8") if isinstance(data, str) else data
        quoted = shlex.quote(path)
        result = await self.exec(f"mkdir -p \"$(dirname {quoted})\" && cat > {quoted}", timeout=60, stdin=payload)
        if result.exit_code != 0:
            raise SandboxError(f"cannot write {path} in the sandbox: {result.stderr.strip() or result.stdout.strip()}")

    async def write_archive(self, tar_bytes: bytes, dest: str = WORKDIR) -> None:
        """Unpack a tar archive into `dest` inside the sandbox."""
        from envhub.errors import SandboxError

        quoted = shlex.quote(dest)
        result = await self.exec(
            f"mkdir -p {quoted} && tar -x --no-same-owner -C {quoted}", timeout=120, stdin=tar_bytes
        )
        if result.exit_code != 0:
            raise SandboxError(f"cannot unpack an archive into {dest}: {result.stderr.strip()}")

    async def upload_dir(self, local_dir: str | Path, dest: str) -> None:
        """Copy a local directory (e.g. a git repo) to `dest` inside the sandbox."""
        import asyncio

        await self.write_archive(await asyncio.to_thread(tar_directory, local_dir), dest)

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def tar_directory(local_dir: str | Path) -> bytes:
    """A tar archive (in memory) of a directory's contents, paths relative to it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        root = Path(local_dir)
        for child in sorted(root.iterdir()):
            tar.add(str(child), arcname=child.name)
    return buffer.getvalue()


def shell_command(cmd: str | list[str]) -> list[str]:
    """The argv that runs `cmd`: a string goes through `sh -c`, a list runs as is."""
    return ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
