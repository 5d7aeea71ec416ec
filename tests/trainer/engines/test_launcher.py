"""ManagedServer with real processes: readiness, errors with the log tail, group stop, parent death, /dev/shm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from envhub.errors import EngineError
from envhub.trainer.engines.launcher import SHM, ManagedServer, _group_members, free_port, module_command
from tests.conftest import default_sigint

# A server with a child in its process group; its /health answers 200.
SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child", child.pid, flush=True)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
    """
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def wait_gone(pid: int, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def child_pid(server: ManagedServer) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in server.log_path.read_text().splitlines():
            if line.startswith("child "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(server.log_tail())


async def test_ready_then_stop_takes_the_whole_group(tmp_path):
    port = free_port()
    server = ManagedServer.start("toy", [sys.executable, "-c", SERVER, str(port)], log_path=tmp_path / "toy.log")
    await server.wait_ready(f"http://127.0.0.1:{port}/health", timeout=60)
    child = child_pid(server)
    assert os.getpgid(child) == server.pid != os.getpgid(0)  # its own group, not ours
    assert server.stop(grace=10) == -signal.SIGTERM
    assert wait_gone(child) and server.returncode is not None


async def test_a_server_that_exits_fails_with_its_log_tail(tmp_path):
    code = "import sys; print('loading model...'); print('RuntimeError: head_dim=16 is not supported'); sys.exit(3)"
    server = ManagedServer.start("toy", [sys.executable, "-c", code], log_path=tmp_path / "toy.log")
    with pytest.raises(EngineError, match="(?s)exited with code 3.*head_dim=16 is not supported"):
        await server.wait_ready(f"http://127.0.0.1:{free_port()}/health", timeout=60)


async def test_a_server_never_ready_is_stopped_at_the_deadline(tmp_path):
    code = "import time; print('still compiling', flush=True); time.sleep(600)"
    server = ManagedServer.start("toy", [sys.executable, "-c", code], log_path=tmp_path / "toy.log")
    with pytest.raises(EngineError, match="(?s)not ready after 2 s.*still compiling"):
        await server.wait_ready(f"http://127.0.0.1:{free_port()}/health", timeout=2)
    assert server.returncode is not None and wait_gone(server.pid)


def test_sigterm_ignored_means_sigkill_after_the_grace_period(tmp_path):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
    )
    server = ManagedServer.start("stubborn", [sys.executable, "-c", code], log_path=tmp_path / "s.log")
    while "up" not in server.log_tail():
        time.sleep(0.05)
    started = time.monotonic()
    assert server.stop(grace=1.0) == -signal.SIGKILL
    assert time.monotonic() - started < 30


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")
def test_a_killed_server_leaves_no_shared_memory_behind(tmp_path):
    import multiprocessing
    from multiprocessing import shared_memory

    ours = shared_memory.SharedMemory(create=True, size=4096)  # someone else's live segment: must stay
    # someone else's live semaphore, created while the server runs: its creator maps it as `sem.XXXXXX (deleted)`,
    # never under its name, so only its inode tells that it is in use
    code = textwrap.dedent(
        """
        import os, signal, time
        from multiprocessing import shared_memory, resource_tracker
        ring = shared_memory.SharedMemory(create=True, size=1 << 20)
        resource_tracker.unregister(ring._name, "shared_memory")  # as a SIGKILLed vLLM: nobody unlinks it
        open(f"/dev/shm/__KMP_REGISTERED_LIB_{os.getpid()}_0", "w").close()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ring", ring.name, flush=True)
        ring.close()  # unmapped, as after the process is gone
        time.sleep(600)
        """
    )
    try:
        server = ManagedServer.start("shm", [sys.executable, "-c", code], log_path=tmp_path / "shm.log")
        while "ring " not in server.log_tail():
            time.sleep(0.05)
        ring = server.log_tail().split("ring ")[1].split()[0].lstrip("/")
        kmp = f"__KMP_REGISTERED_LIB_{server.pid}_0"
        lock = multiprocessing.get_context("spawn").Lock()
        semaphore = SHM / f"sem.{lock._semlock.name.lstrip('/')}"
        assert (SHM / ring).exists() and (SHM / kmp).exists() and semaphore.exists()
        assert server.stop(grace=0.5) == -signal.SIGKILL
        assert not (SHM / ring).exists() and not (SHM / kmp).exists()
        assert (SHM / ours.name.lstrip("/")).exists() and semaphore.exists()
    finally:
        ours.close()
        ours.unlink()


def run_parent(code: str) -> subprocess.CompletedProcess | subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,  # the Ctrl-C test needs the terminal's SIGINT, whatever pytest's worker has
    )


def test_the_server_dies_with_a_sigkilled_parent():
    port = free_port()
    parent = run_parent(
        textwrap.dedent(
            f"""
            import sys, time
            from envhub.trainer.engines.launcher import ManagedServer, module_command
            server = ManagedServer.start("orphan", module_command(sys.executable, "http.server", ["{port}"]))
            print(server.pid, flush=True)
            time.sleep(600)
            """
        )
    )
    server_pid = int(parent.stdout.readline())
    time.sleep(1.0)
    assert alive(server_pid)
    parent.kill()  # no atexit, no finally: only the kernel's parent-death signal is left
    parent.wait()
    assert wait_gone(server_pid)


def test_servers_left_running_are_stopped_at_interpreter_exit():
    parent = run_parent(
        textwrap.dedent(
            """
            import sys
            from envhub.trainer.engines.launcher import ManagedServer
            server = ManagedServer.start("forgotten", [sys.executable, "-c", "import time; time.sleep(600)"])
            print(server.pid, flush=True)
            """
        )
    )
    server_pid = int(parent.stdout.readline())
    assert parent.wait(timeout=60) == 0
    assert wait_gone(server_pid)


def test_module_command_refuses_to_start_when_its_parent_is_gone():
    command = module_command(sys.executable, "http.server", ["0"])
    command[3] = "1"  # claim a parent pid that is not ours: the shim must exit instead of serving
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "parent exited before the server started" in done.stderr


def test_ctrl_c_in_the_parent_stops_the_server_group():
    port = free_port()
    parent = run_parent(
        textwrap.dedent(
            f"""
            import sys, time
            from envhub.trainer.engines.launcher import ManagedServer, module_command
            server = ManagedServer.start("interrupted", [sys.executable, "-c", {SERVER!r}, "{port}"])
            print(server.pid, flush=True)
            time.sleep(600)
            """
        )
    )
    server_pid = int(parent.stdout.readline())
    time.sleep(1.0)
    assert alive(server_pid)
    parent.send_signal(signal.SIGINT)  # Ctrl-C: KeyboardInterrupt unwinds the parent, whose exit hook stops the group
    output = parent.communicate(timeout=60)[0]
    assert "KeyboardInterrupt" in output
    assert wait_gone(server_pid) and not _group_members(server_pid)


def test_default_logs_stay_for_reading_and_only_the_newest_are_kept(tmp_path, monkeypatch):
    from envhub.trainer.engines import launcher

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the temp dir tempfile.gettempdir() answers
    monkeypatch.setattr(launcher, "KEPT_LOGS", 3)
    crashed = ManagedServer.start("crashed", [sys.executable, "-c", "raise SystemExit('bad weights')"])
    crashed.process.wait(timeout=60)
    crashed.stop()
    assert "bad weights" in crashed.log_path.read_text()  # after the stop, for the person reading the error
    folder = crashed.log_path.parent
    assert folder.parent == tmp_path and folder.stat().st_mode & 0o777 == 0o700  # one user's logs
    for index in range(4):
        (folder / f"old-{index}.log").write_text("x")
        os.utime(folder / f"old-{index}.log", (index, index))  # older than the crash's log, oldest first
    newest = launcher.default_log("next")
    assert sorted(p.name for p in folder.glob("*.log")) == sorted(
        [crashed.log_path.name, "old-3.log", newest.name]
    )  # the newest KEPT_LOGS, the new one included
