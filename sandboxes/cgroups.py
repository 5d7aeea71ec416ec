"""Per-sandbox cgroups (v1 or v2) for the bubblewrap backend: memory, pids and CPU limits, OOM counts.

Used when the cgroup filesystem is writable (root on the host); otherwise `available()` is False
and the backend falls back to rlimits.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from envhub.sandboxes.base import SandboxLimits
from envhub.sandboxes.process import pid_alive

ROOT = Path("/sys/fs/cgroup")
PARENT = "envhub-bwrap"


def version() -> int:
    """2 for the unified hierarchy, 1 for split controllers, 0 when neither is usable."""
    if (ROOT / "cgroup.controllers").exists():
        return 2
    if (ROOT / "memory").is_dir() and (ROOT / "pids").is_dir():
        return 1
    return 0


def available() -> bool:
    """True when this process may create cgroups for sandboxes."""
    v = version()
    if v == 0:
        return False
    probe = ROOT / PARENT if v == 2 else ROOT / "memory" / PARENT
    try:
        probe.mkdir(exist_ok=True)
    except OSError:
        return False
    if v == 2:
        _enable_v2_controllers()
    return os.access(probe, os.W_OK)


def _enable_v2_controllers() -> None:
    try:
        (ROOT / PARENT / "cgroup.subtree_control").write_text("+memory +pids +cpu")
    except OSError:
        pass


class Cgroup:
    """The cgroups of one sandbox: create with limits, add processes, count OOM kills, remove."""

    def __init__(self, name: str, limits: SandboxLimits) -> None:
        self.version = version()
        if self.version == 2:
            self.dirs = [ROOT / PARENT / name]
        else:
            self.dirs = [ROOT / controller / PARENT / name for controller in ("memory", "pids", "cpu")]
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        memory = limits.memory_mb * 2**20
        period = 100_000
        quota = int(limits.cpus * period)
        if self.version == 2:
            self._write(self.dirs[0] / "memory.max", memory)
            self._write(self.dirs[0] / "memory.swap.max", 0, optional=True)
            self._write(self.dirs[0] / "pids.max", limits.pids)
            self._write(self.dirs[0] / "cpu.max", f"{quota} {period}", optional=True)
        else:
            mem, pids, cpu = self.dirs
            self._write(mem / "memory.limit_in_bytes", memory)
            self._write(mem / "memory.memsw.limit_in_bytes", memory, optional=True)
            self._write(pids / "pids.max", limits.pids)
            self._write(cpu / "cpu.cfs_period_us", period, optional=True)
            self._write(cpu / "cpu.cfs_quota_us", quota, optional=True)

    @staticmethod
    def _write(path: Path, value: object, optional: bool = False) -> None:
        try:
            path.write_text(str(value))
        except OSError:
            if not optional:
                raise

    def procs_files(self) -> list[str]:
        """The cgroup.procs files a new process writes its pid into (before exec)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this cgroup so far."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = (self.dirs[0] / name).read_text()
        except OSError:
            return 0
        match = re.search(r"oom_kill (\d+)", text)
        return int(match.group(1)) if match else 0

    def kill_all(self) -> None:
        """SIGKILL every process left in the cgroup."""
        for d in self.dirs:
            try:
                pids = (d / "cgroup.procs").read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def remove(self) -> None:
        """Kill what is left and delete the cgroups."""
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill_all()
                    import time

                    time.sleep(0.01)


def remove_orphans(alive: set[str]) -> list[str]:
    """Remove sandbox cgroups whose names are not in `alive` and whose owner pid is dead."""
    removed = []
    parents = [ROOT / PARENT] if version() == 2 else [ROOT / c / PARENT for c in ("memory", "pids", "cpu")]
    for parent in parents:
        if not parent.is_dir():
            continue
        for child in parent.iterdir():
            if not child.is_dir() or child.name in alive:
                continue
            owner = child.name.split("-", 1)[0]
            if owner.isdigit() and pid_alive(int(owner)):
                continue
            try:
                child.rmdir()
                removed.append(str(child))
            except OSError:
                pass
    return removed
