"""A restarted Docker daemon: the pool rebuilds its spares, and a clean stop leaves no container behind.

The daemon restarted is a private one (its own data root and socket, started here; the DOCKER_HOST of this test
points at it), so other users of the machine's daemon are never disturbed. Its image is a busybox rootfs imported
offline.
"""

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from envhub.sandboxes import SandboxPool, docker_backend
from envhub.sandboxes.docker_backend import LABEL_SANDBOX, shared_client
from envhub.sandboxes.testing import unavailable

IMAGE = "envhub-test/busybox:restart"


class PrivateDaemon:
    """`dockerd` on its own data root, exec root and socket under one short directory (socket paths are short)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="envhub-dockerd-", dir="/tmp"))
        self.host = f"unix://{self.root}/docker.sock"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        argv = ["dockerd", "--data-root", f"{self.root}/data", "--exec-root", f"{self.root}/exec"]
        argv += ["--pidfile", f"{self.root}/docker.pid", "--host", self.host, "--iptables=false", "--bridge=none"]
        with open(self.root / "dockerd.log", "ab") as log:  # the daemon keeps its own copy of the descriptor
            self.process = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        for _ in range(240):
            if self.process.poll() is not None:
                pytest.fail((self.root / "dockerd.log").read_text()[-2000:])
            if self.docker("info").returncode == 0:
                return
            subprocess.run(["sleep", "0.25"])
        pytest.fail("the private dockerd did not answer")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # stops its containers, as a daemon restart does
            self.process.wait(timeout=120)

    def docker(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, "DOCKER_HOST": self.host}
        return subprocess.run(["docker", *args], input=stdin, capture_output=True, env=env)

    def import_busybox(self) -> None:
        rootfs = self.root / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        for name in ("tmp", "workspace", "etc"):
            (rootfs / name).mkdir()
        shutil.copy(shutil.which("busybox") or "/bin/busybox", rootfs / "bin" / "busybox")
        applets = subprocess.run([rootfs / "bin" / "busybox", "--list"], capture_output=True, text=True).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (rootfs / "bin" / applet).symlink_to("busybox")
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        done = self.docker("import", "-", IMAGE, stdin=tar)
        assert done.returncode == 0, done.stderr

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_daemon(monkeypatch):
    if shutil.which("dockerd") is None or shutil.which("busybox") is None:
        unavailable("dockerd and busybox are needed (make install)")
    daemon = PrivateDaemon()
    try:
        daemon.start()
        daemon.import_busybox()
        monkeypatch.setenv("DOCKER_HOST", daemon.host)
        monkeypatch.setattr(docker_backend, "_client", None)  # the SDK client of this process now talks to it
        yield daemon
    finally:
        daemon.remove()


@pytest.mark.docker
async def test_a_restarted_daemon_gets_fresh_spares_and_a_clean_stop_leaves_nothing(private_daemon, capsys):
    async with SandboxPool(backend="docker", image=IMAGE, size=2, max_size=4) as pool:
        async with pool.acquire() as sandbox:
            assert (await sandbox.exec("echo before", timeout=10)).stdout == "before\n"
        while pool.metrics().spares < 2:  # the refill after the release
            await asyncio.sleep(0.05)

        await asyncio.to_thread(private_daemon.stop)  # every container stops with the daemon
        await asyncio.to_thread(private_daemon.start)
        async with pool.acquire() as sandbox:  # a stopped spare is never handed out
            assert (await sandbox.exec("echo after", timeout=10)).stdout == "after\n"
        assert pool.metrics().unhealthy == 2 and pool.metrics().cold_starts == 1
        while pool.metrics().spares < 2:  # rebuilt
            await asyncio.sleep(0.05)
        async with pool.acquire() as sandbox:  # and warm again
            assert (await sandbox.exec("echo warm", timeout=10)).stdout == "warm\n"
        assert pool.metrics().cold_starts == 1

    left = shared_client().api.containers(all=True, filters={"label": LABEL_SANDBOX})
    assert left == [], [c.get("Names") for c in left]  # the stopped containers of before the restart too
    from envhub.cli.main import main

    assert main(["sandbox", "gc"]) == 0
    assert "removed 0 sandbox containers" in capsys.readouterr().out
