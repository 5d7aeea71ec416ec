"""`BwrapSandbox`: each command runs in a fresh bubblewrap namespace over the read-only base rootfs.

A sandbox is a directory holding its writable /workspace and /tmp (a size-capped tmpfs when this
process is root) plus, where cgroups are writable, its own memory / pids / CPU cgroup; otherwise
rlimits stand in. Every command gets `--unshare-all` (no network), uid 1000, no capabilities and
a new session; a timeout SIGKILLs bwrap, and `--die-with-parent` takes the whole PID namespace down.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from envhub.errors import SandboxError
from envhub.sandboxes import cgroups
from envhub.sandboxes.base import SANDBOX_GID, SANDBOX_UID, WORKDIR, ExecResult, Sandbox, SandboxLimits
from envhub.sandboxes.process import pid_alive, run_process

log = logging.getLogger(__name__)

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandboxes_dir() -> Path:
    """Where bwrap sandboxes keep their writable directories."""
    return Path(tempfile.gettempdir()) / "envhub-bwrap"


def check_bwrap() -> None:
    """Raise SandboxError naming the fix when bubblewrap or the base rootfs is missing."""
    if shutil.which("bwrap") is None:
        raise SandboxError("bubblewrap is not installed", hint="run `make install` (apt-get install bubblewrap)")
    from envhub.sandboxes.images import ensure_rootfs

    ensure_rootfs(build=False)


class BwrapSandbox(Sandbox):
    """A sandbox made of bubblewrap namespaces over a local rootfs (default: the base image's)."""

    def __init__(
        self,
        rootfs: str | Path | None = None,
        *,
        limits: SandboxLimits | None = None,
        ro_binds: Mapping[str, str] | None = None,
    ) -> None:
        self.rootfs = Path(rootfs) if rootfs else None
        # host path -> path inside, read-only; the inside path exists in the rootfs or lies under /workspace or /tmp
        self.ro_binds = {str(Path(host).resolve()): inside for host, inside in (ro_binds or {}).items()}
        self.limits = limits or SandboxLimits()
        self.name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.root = sandboxes_dir() / self.name
        self.cgroup: cgroups.Cgroup | None = None
        self.dead = False
        self._mounted = False
        self._oom_kills = 0

    async def start(self) -> None:
        """Create the writable directories (tmpfs when root) and the cgroup."""
        if self.rootfs is None:
            from envhub.sandboxes.images import ensure_rootfs

            self.rootfs = await asyncio.to_thread(ensure_rootfs, build=False)
        if not (self.rootfs / "usr" / "bin").is_dir():
            raise SandboxError(f"{self.rootfs} is not a rootfs", hint="run `envhub sandbox build`")
        await asyncio.to_thread(self._prepare)

    def _prepare(self) -> None:
        self.root.mkdir(parents=True)
        if os.geteuid() == 0:
            size = (self.limits.workdir_mb + self.limits.tmp_mb) * 2**20
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "envhub-bwrap", str(self.root)],
                check=True,
                capture_output=True,
            )
            self._mounted = True
        (self.root / "workspace").mkdir()
        (self.root / "tmp").mkdir(mode=0o1777)
        os.chmod(self.root / "tmp", 0o1777)
        if cgroups.available():
            self.cgroup = cgroups.Cgroup(self.name, self.limits)

    def _argv(self, argv: list[str], cwd: str, env: dict[str, str]) -> list[str]:
        command = [
            "bwrap",
            "--ro-bind", str(self.rootfs), "/",
            "--bind", str(self.root / "workspace"), WORKDIR,
            "--bind", str(self.root / "tmp"), "/tmp",
            "--proc", "/proc",
            "--dev", "/dev",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_GID),
            "--cap-drop", "ALL",
            "--hostname", "sandbox",
            "--chdir", cwd,
            "--clearenv",
        ]  # fmt: skip
        at = command.index("--proc")  # after /workspace and /tmp, so a bind may land inside them
        for host, inside in self.ro_binds.items():
            command[at:at] = ["--ro-bind", host, inside]
        if self.limits.network:
            command.insert(command.index("--unshare-all") + 1, "--share-net")
        variables = {"HOME": WORKDIR, "PATH": _PATH, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **env}
        for key, value in variables.items():
            command += ["--setenv", key, value]
        return command + ["--", *argv]

    def _launcher(self) -> list[str]:
        # Limits are applied by a tiny wrapper that runs before bwrap, not by a preexec_fn: a
        # preexec_fn (and cgroup v1 attach, which can take tens of ms) would run while the event
        # loop waits in fork/exec.
        pin = ["taskset", "-c", self.limits.cpuset] if self.limits.cpuset else []
        if self.cgroup is not None:
            writes = "; ".join(f"echo $$ > {path}" for path in self.cgroup.procs_files())
            return ["sh", "-c", f'{writes} && exec "$@"', "envhub-cgroup-enter", *pin]
        memory, files = self.limits.memory_mb * 2**20, self.limits.workdir_mb * 2**20
        return ["prlimit", f"--as={memory}", f"--nproc={self.limits.pids}", f"--fsize={files}", "--", *pin]

    async def _run(
        self, argv: list[str], *, timeout: float, stdin: bytes | None, cwd: str, env: dict[str, str], max_output: int
    ) -> ExecResult:
        if self.dead or self.rootfs is None:
            raise SandboxError(
                "sandbox is not running (never started or closed)", hint="acquire a fresh sandbox from the pool"
            )
        result = await run_process(
            self._launcher() + self._argv(argv, cwd, env),
            timeout=timeout,
            stdin=stdin,
            max_output=max_output,
            env={"PATH": _PATH},
        )
        if result.timed_out and self.cgroup is not None:
            self.cgroup.kill_all()
        if self.cgroup is not None and result.exit_code == 137:
            count = self.cgroup.oom_kills()
            if count > self._oom_kills:
                self._oom_kills = count
                from dataclasses import replace

                result = replace(result, oom_killed=True)
        return result

    async def close(self) -> None:
        """Kill leftovers, remove the cgroup, unmount and delete the directories."""
        self.dead = True
        await asyncio.to_thread(self._teardown)

    def _teardown(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        _remove_dir(self.root, self._mounted)
        self._mounted = False


def _remove_dir(path: Path, mounted: bool, attempts: int = 50) -> None:
    """Unmount and delete a sandbox directory. Processes of a sandbox killed a moment ago may still be exiting and
    writing into it (CI saw a timed-out harness's directory survive one pass), so it is tried again until gone."""
    errors: list[str] = []
    for _ in range(attempts):
        if mounted or os.path.ismount(path):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        shutil.rmtree(path, onerror=lambda _f, p, info: errors.append(f"{p}: {info[1]}"))
        if not path.exists():
            return
        time.sleep(0.02)
    log.warning("could not remove sandbox directory %s (%s)", path, errors[-1] if errors else "still there")


def remove_orphan_dirs() -> list[str]:
    """Remove sandbox directories and cgroups left by dead processes; return what was removed."""
    removed = []
    base = sandboxes_dir()
    alive = set()
    if base.is_dir():
        for child in base.iterdir():
            owner = child.name.split("-", 1)[0]
            if owner.isdigit() and pid_alive(int(owner)):
                alive.add(child.name)
                continue
            _remove_dir(child, False)
            removed.append(str(child))
    if cgroups.available():
        removed += cgroups.remove_orphans(alive)
    return removed
