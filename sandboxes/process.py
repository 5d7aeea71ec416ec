"""Run a local process with capped output and a hard timeout that kills its whole process group."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from envhub.sandboxes.base import ExecResult, OutputCap

_CHUNK = 1 << 16


async def _drain(stream: asyncio.StreamReader | None, sink: OutputCap) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_CHUNK):
        sink.feed(chunk)


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    if proc.stdin is None:
        return
    try:
        if data:
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


async def run_process(
    argv: list[str],
    *,
    timeout: float,
    stdin: bytes | None,
    max_output: int,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> ExecResult:
    """Run argv in a new session; on timeout SIGKILL its process group; stdout/stderr capped at max_output."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
        limit=_CHUNK * 4,
    )
    stdout, stderr = OutputCap(max_output), OutputCap(max_output)
    work = asyncio.gather(_feed(proc, stdin), _drain(proc.stdout, stdout), _drain(proc.stderr, stderr), proc.wait())
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(work), timeout)
    except asyncio.TimeoutError:
        timed_out = True
        kill_group(proc.pid)
        try:
            await asyncio.wait_for(work, 10)
        except asyncio.TimeoutError:
            work.cancel()  # a grandchild outside the group holds the pipes open
    except asyncio.CancelledError:
        kill_group(proc.pid)
        raise
    code = proc.returncode if proc.returncode is not None else -9
    return ExecResult(
        exit_code=-9 if timed_out else (128 - code if code < 0 else code),
        stdout=stdout.text(),
        stderr=stderr.text(),
        timed_out=timed_out,
        truncated=stdout.truncated or stderr.truncated,
        duration=time.perf_counter() - started,
    )


def kill_group(pid: int) -> None:
    """SIGKILL a process group (the session leader's pid names it); ignore it if already gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
