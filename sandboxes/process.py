"""Run a local process with capped output and a hard timeout that kills its whole process group."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

from envhub.sandboxes.base import ExecResult, OutputCap

_CHUNK = 1 << 16


async def _drain(stream: asyncio.StreamReader | None, sink: OutputCap) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_CHUNK):
        sink.feed(chunk)


def _write_stdin(pipe, data: bytes | None) -> None:
    try:
        if data:
            pipe.write(data)
        pipe.close()
    except (BrokenPipeError, ConnectionResetError, ValueError):
        pass


async def _pipe_reader(pipe) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_CHUNK * 4)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader


async def _wait_exit(proc: subprocess.Popen) -> int:
    """Wait for the process to exit without a thread: a pidfd becomes readable when it does."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return await asyncio.to_thread(proc.wait)
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()


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
    # fork/exec happens in a worker thread: on a loaded machine it can take 100+ ms, which must
    # not stall the event loop (asyncio.create_subprocess_exec would do it on the loop's thread).
    proc = await asyncio.to_thread(
        subprocess.Popen,
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    stdout, stderr = OutputCap(max_output), OutputCap(max_output)
    try:
        out_reader, err_reader = await _pipe_reader(proc.stdout), await _pipe_reader(proc.stderr)
    except BaseException:
        kill_group(proc.pid)
        raise
    feeder = asyncio.ensure_future(asyncio.to_thread(_write_stdin, proc.stdin, stdin))
    work = asyncio.gather(_drain(out_reader, stdout), _drain(err_reader, stderr), _wait_exit(proc))
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(work), timeout)
    except TimeoutError:
        timed_out = True
        kill_group(proc.pid)
        try:
            await asyncio.wait_for(work, 10)
        except TimeoutError:
            work.cancel()  # a grandchild outside the group holds the pipes open
    except asyncio.CancelledError:
        kill_group(proc.pid)
        raise
    finally:
        await asyncio.wait([feeder], timeout=10)
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


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (also one we may not signal); used to find orphans."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
