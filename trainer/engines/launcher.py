"""A managed inference-server process: started in its own process group, polled until ready, always stopped.

`ManagedServer.start(command, ...)` runs the command in a new session (so it and every process it spawns
share one process group, and a Ctrl-C at the terminal reaches only us), with a parent-death signal so that
even a SIGKILLed trainer takes the server with it. `wait_ready()` polls a health URL until it answers 200,
failing with the server's log tail when the process exits or the deadline passes. `stop()` sends SIGTERM to
the whole group, then SIGKILL after a grace period, and removes the shared-memory files a killed group
leaves in /dev/shm. Servers still running when the interpreter exits are stopped by an atexit hook.

Used by the vLLM engine; written for any server launched from a command line (an SGLang launcher can reuse
it as is).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import aiohttp

from envhub.errors import EngineError

SHM = Path("/dev/shm")
# What a SIGKILLed multiprocessing / OpenMP server leaves behind: shared-memory rings, named semaphores, and
# libiomp's registration file (named after the pid).
_SHM_LEFTOVER = re.compile(r"(psm_|sem\.mp-|__KMP_REGISTERED_LIB_)")

# Runs the server under a parent-death signal: the kernel sends SIGTERM when the thread that started it (the
# trainer's event-loop thread) exits, however it exits. A parent already gone by then means: do not start.
_PDEATHSIG_SHIM = (
    "import ctypes, os, runpy, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('envhub launcher: parent exited before the server started')\n"
    "module = sys.argv[2]\n"
    "sys.argv = [module] + sys.argv[3:]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)

_RUNNING: set[ManagedServer] = set()
_RUNNING_LOCK = threading.Lock()

# Servers started without a log path log to a folder of their own under the temp dir, one per user, which keeps
# the newest KEPT_LOGS: a log stays for reading after the run (an error names it, a server-side traceback is in it),
# and a machine that launches servers all day does not collect them without end.
KEPT_LOGS = 32


def default_log(name: str) -> Path:
    """A new log file for a server called `name`, in the per-user log folder, past logs beyond KEPT_LOGS removed."""
    folder = Path(tempfile.gettempdir()) / f"envhub-server-logs-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    logs = sorted(folder.glob("*.log"), key=_mtime)
    for old in logs[: max(0, len(logs) - (KEPT_LOGS - 1))]:
        old.unlink(missing_ok=True)  # another process may have pruned it first
    handle, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log", dir=folder)
    os.close(handle)
    return Path(path)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def module_command(python: str | Path, module: str, args: Sequence[str]) -> list[str]:
    """`python -m module args` run under the parent-death shim (the server dies with the process starting it)."""
    return [str(python), "-c", _PDEATHSIG_SHIM, str(os.getpid()), module, *map(str, args)]


class ManagedServer:
    """One server process group: start, wait until ready, stop (SIGTERM, then SIGKILL), clean up."""

    def __init__(self, name: str, process: subprocess.Popen, log_path: Path, shm_before: set[str]) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path
        self._shm_before = shm_before
        self._group_pids: set[int] = {process.pid}

    @classmethod
    def start(
        cls,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: str | Path | None = None,
        cwd: str | Path | None = None,
        inherit_output: bool = False,
    ) -> ManagedServer:
        """Start `command` in a new session, its stdout and stderr going to `log_path` (by default a new file of
        `default_log`), or to ours with `inherit_output` (a server run in the foreground)."""
        path = Path(log_path) if log_path else default_log(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        shm_before = _shm_names()
        with open(path, "ab") as log:
            try:
                process = subprocess.Popen(
                    list(command),
                    stdin=subprocess.DEVNULL,
                    stdout=None if inherit_output else log,
                    stderr=None if inherit_output else subprocess.STDOUT,
                    env=dict(env) if env is not None else None,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise EngineError(f"cannot start {name}: {exc}", hint=f"command: {' '.join(command[:3])} ...") from exc
        server = cls(name, process, path, shm_before)
        with _RUNNING_LOCK:
            _RUNNING.add(server)
        return server

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """None while the server's main process runs, else its exit status."""
        return self.process.poll()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log (for error messages)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - chars))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def exit_error(self) -> EngineError:
        """The error to raise when the server has exited: its code and log tail."""
        code = self.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return EngineError(
            f"the {self.name} server (pid {self.pid}) {how}; its log ends:\n{self.log_tail()}",
            hint=f"full log: {self.log_path}",
        )

    async def wait_ready(self, health_url: str, timeout: float) -> None:
        """Poll `health_url` until it answers 200; EngineError (with the log tail) on exit or after `timeout` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        probe = aiohttp.ClientTimeout(total=5, sock_connect=2)
        async with aiohttp.ClientSession(timeout=probe) as session:
            while True:
                if self.returncode is not None:
                    raise self.exit_error()
                try:
                    async with session.get(health_url) as response:
                        if response.status == 200:
                            self._group_pids |= _group_members(self.pid)  # all up now; some may die unseen later
                            return
                except (TimeoutError, aiohttp.ClientError):
                    pass
                if loop.time() > deadline:
                    tail = self.log_tail()
                    await asyncio.to_thread(self.stop)
                    raise EngineError(
                        f"the {self.name} server was not ready after {timeout:.0f} s; its log ends:\n{tail}",
                        hint=f"full log: {self.log_path}",
                    )
                await asyncio.sleep(0.5)

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM the whole process group, SIGKILL it after `grace` seconds; returns the main process's status."""
        self._group_pids |= _group_members(self.pid)
        killed = self.returncode is not None  # it ended before we asked (a crash, an OOM kill): it may have leaked
        if _group_alive(self.pid):
            _signal_group(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while _group_alive(self.pid) and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.1)
            if _group_alive(self.pid):
                killed = True
                self._group_pids |= _group_members(self.pid)
                _signal_group(self.pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while _group_alive(self.pid) and time.monotonic() < deadline:
                    self._reap()
                    time.sleep(0.1)
        # the group leader shows as a zombie while its last threads are still exiting: wait for it, briefly
        self._reap(timeout=5.0)
        with _RUNNING_LOCK:
            _RUNNING.discard(self)
        # A group that exited on our SIGTERM unlinked its own segments; only a killed or crashed one leaks them.
        # Cleaning only then keeps us away from segments other servers are creating at this very moment.
        clean_shm_leftovers(self._shm_before, self._group_pids, segments=killed)
        return self.process.returncode

    def _reap(self, timeout: float = 0.0) -> None:
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` exists (zombies of our own child excluded)."""
    return bool(_group_members(pgid))


def _group_members(pgid: int) -> set[int]:
    """Pids of the live (not zombie) processes in process group `pgid`."""
    members = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            members.add(int(entry.name))
    return members


def _shm_names() -> set[str]:
    try:
        return {p.name for p in SHM.iterdir()}
    except OSError:
        return set()


def _mapped_shm() -> set[tuple[int, int]]:
    """(device, inode) of every /dev/shm file some live process maps. By inode, not name: a named semaphore is
    created under a temporary name and linked to its real one, so its creator's maps show `sem.XXXXXX (deleted)`."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        for device, inode in re.findall(r"^\S+ \S+ \S+ ([0-9a-f]+:[0-9a-f]+) (\d+) +/dev/shm/", text, re.M):
            major, minor = device.split(":")
            mapped.add((os.makedev(int(major, 16), int(minor, 16)), int(inode)))
    return mapped


def clean_shm_leftovers(before: set[str], pids: set[int], segments: bool = True) -> list[str]:
    """Remove what a stopped server group left in /dev/shm: libiomp's files named after its pids and, with
    `segments`, multiprocessing segments and semaphores that appeared since it started and no live process maps
    (a SIGKILLed vLLM leaves ~400 MiB of rings)."""
    new = [name for name in _shm_names() - before if _SHM_LEFTOVER.match(name)]
    if not new:
        return []
    mapped = _mapped_shm() if segments else set()
    removed = []
    for name in new:
        if name.startswith("__KMP_REGISTERED_LIB_"):
            if not any(name.startswith(f"__KMP_REGISTERED_LIB_{pid}_") for pid in pids):
                continue
        elif not segments:
            continue
        else:
            try:
                info = (SHM / name).stat()
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in mapped:
                continue
        try:
            (SHM / name).unlink()
            removed.append(name)
        except OSError:
            pass
    return removed


@atexit.register
def _stop_all_at_exit() -> None:
    with _RUNNING_LOCK:
        servers = list(_RUNNING)
    for server in servers:
        try:
            server.stop(grace=10.0)
        except Exception as exc:  # exiting anyway: say so, never raise from atexit
            print(f"envhub: could not stop the {server.name} server (pid {server.pid}): {exc}", file=sys.stderr)
