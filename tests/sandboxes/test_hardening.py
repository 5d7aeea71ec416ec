"""Hostile commands, each contained, with the pool still serving afterwards (docker and bwrap)."""

import asyncio
import os
from pathlib import Path

import pytest

from envhub.sandboxes import SandboxLimits, SandboxPool

SPAWN_MANY = """
import subprocess
children = []
try:
    for _ in range(200):
        children.append(subprocess.Popen(["sleep", "20"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
except OSError:
    pass
print(len(children))
for child in children:
    child.kill()
"""
LIMITS = SandboxLimits(memory_mb=256, pids=64, workdir_mb=16, tmp_mb=16, max_output_bytes=64 * 1024)


@pytest.fixture(params=["docker", "bwrap"])
async def pool(request):
    request.getfixturevalue("base_rootfs" if request.param == "bwrap" else "base_image")
    async with SandboxPool(backend=request.param, size=1, max_size=2, limits=LIMITS) as pool:
        yield pool
        async with pool.acquire() as sb:  # still serving after the attack
            r = await sb.exec("echo still-serving", timeout=20)
            assert r.stdout == "still-serving\n"


async def test_no_network_to_host_loopback(pool):
    connections = []
    server = await asyncio.start_server(lambda r, w: connections.append(w.close()), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with pool.acquire() as sb:
            r = await sb.exec(
                f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); "
                f"print('connected')\"",
                timeout=20,
            )
        # and the host really was listening: a connection from here succeeds
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await asyncio.sleep(0.05)
    finally:
        server.close()
    assert r.exit_code != 0 and "connected" not in r.stdout
    assert "Error" in r.stderr
    assert len(connections) == 1  # only the host's own probe


async def test_fork_bomb_is_contained(pool):
    async with pool.acquire() as sb:
        r = await sb.exec("bash -c ':(){ :|:& };:'; sleep 3; echo done", timeout=8)
        assert r.exit_code != 0 or r.timed_out or "retry" in r.stderr or "fork" in r.stderr.lower()
    async with pool.acquire() as sb:
        r = await sb.exec("python3 -", stdin=SPAWN_MANY, timeout=30)
        assert 0 < int(r.stdout) < LIMITS.pids, r


async def test_memory_hog_is_oom_killed_and_reported(pool):
    async with pool.acquire() as sb:
        r = await sb.exec("python3 -c 'x = bytearray(1024 * 2**20); print(len(x))'", timeout=60)
    assert r.exit_code == 137 and r.oom_killed, r
    assert r.stdout == ""


async def test_disk_fill_hits_the_size_cap(pool):
    async with pool.acquire() as sb:
        r = await sb.exec(
            "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1; stat -c %s /workspace/big", timeout=60
        )
        size = int(r.stdout.split()[-1])
        assert "No space left" in r.stdout or "File too large" in r.stdout
        assert size <= (LIMITS.workdir_mb + LIMITS.tmp_mb) * 2**20
        r = await sb.exec("echo ok > /workspace/small || echo full", timeout=10)


def peak_rss_mb(reset: bool = False) -> float:
    """This process's peak RSS (VmHWM) in MiB; `reset` first sets the peak to the current RSS (Linux >= 4.0).

    Without the reset, the suite's earlier peaks (models loaded by other tests) would hide any growth here."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


async def test_huge_stdout_is_capped_and_memory_bounded(pool):
    peak_before = peak_rss_mb(reset=True)
    async with pool.acquire() as sb:
        r = await sb.exec("head -c 100000000 /dev/zero | tr '\\0' a; echo tail >&2", timeout=120)
    grown_mb = peak_rss_mb() - peak_before
    assert r.truncated and len(r.stdout) == LIMITS.max_output_bytes and set(r.stdout) == {"a"}
    assert r.stderr == "tail\n" and r.exit_code == 0
    assert grown_mb < 50, f"host process grew {grown_mb:.0f} MB"


async def test_sigterm_ignoring_tree_is_killed_on_timeout(pool):
    # a sleep length of this process's own: the other backend's copy of this test may run on another worker now
    marker = f"4242.{os.getpid()}"
    program = (
        f"import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.fork(); os.setsid(); "
        f"time.sleep({marker})"
    )
    async with pool.acquire() as sb:
        r = await sb.exec(f"python3 -c '{program}' & python3 -c '{program}'", timeout=1)
        assert r.timed_out and r.duration < 15
        ps = await sb.exec("ps -eo args --no-headers", timeout=10)
        assert marker not in ps.stdout
    for _ in range(200):  # the sandbox's teardown reaps what is left on the host: wait for it, up to 10 s
        if not any(marker.encode() in c for c in _host_cmdlines()):
            break
        await asyncio.sleep(0.05)
    assert not any(marker.encode() in c for c in _host_cmdlines())


def _host_cmdlines() -> list[bytes]:
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            pass  # exited meanwhile
    return lines


async def test_root_is_read_only(pool):
    async with pool.acquire() as sb:
        for path in ("/usr/bin/evil", "/etc/passwd", "/root/x", "/evil"):
            r = await sb.exec(f"echo x > {path}", timeout=10)
            assert r.exit_code != 0, path
        assert (await sb.exec("echo x > /workspace/fine && echo x > /tmp/fine", timeout=10)).exit_code == 0


async def test_not_root_and_no_capabilities(pool):
    async with pool.acquire() as sb:
        r = await sb.exec("id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status", timeout=10)
        lines = r.stdout.split("\n")
        assert lines[:2] == ["1000", "1000"]
        status = dict(line.split(":\t") for line in lines[2:] if line)
        assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == "0000000000000000"
        assert status["NoNewPrivs"] == "1"
        r = await sb.exec("chown root /workspace 2>&1 || echo denied", timeout=10)
        assert "denied" in r.stdout
