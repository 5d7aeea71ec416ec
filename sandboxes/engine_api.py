"""A small asyncio client for the Docker engine's exec endpoints over its unix socket.

The docker SDK buffers exec output in memory and blocks a thread per call; here exec output is
streamed from the socket into byte-capped buffers on the event loop, so 100 MB of stdout costs
nothing but the cap, and hundreds of episodes need no threads.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from typing import Any
from urllib.parse import urlparse

from envhub.errors import SandboxError
from envhub.sandboxes.base import OutputCap

_CHUNK = 1 << 16


def engine_socket_path() -> str:
    """The unix socket of the local Docker engine (from DOCKER_HOST, default /var/run/docker.sock)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    parsed = urlparse(host)
    if parsed.scheme != "unix":
        raise SandboxError(
            f"DOCKER_HOST={host} is not a unix socket", hint="envhub sandboxes need a embedded engine (unix socket)"
        )
    return parsed.path


class EngineAPI:
    """Exec create / start (streamed, capped) / inspect against one engine socket."""

    def __init__(self, socket_path: str | None = None) -> None:
        self.socket_path = socket_path or engine_socket_path()

    async def _request(
        self, method: str, path: str, body: Any = None, upgrade: bool = False
    ) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=_CHUNK * 4)
        except OSError as exc:
            raise SandboxError(
                f"Docker engine not reachable at {self.socket_path} ({exc.strerror})",
                hint="run `make install` or start dockerd",
            ) from None
        payload = json.dumps(body).encode() if body is not None else b""
        headers = [f"{method} {path} HTTP/1.1", "Host: docker", f"Content-Length: {len(payload)}"]
        if body is not None:
            headers.append("Content-Type: application/json")
        headers += ["Connection: Upgrade", "Upgrade: tcp"] if upgrade else ["Connection: close"]
        try:
            writer.write(("\r\n".join(headers) + "\r\n\r\n").encode() + payload)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as exc:
            writer.close()
            raise SandboxError(
                f"Docker engine closed the connection during {method} {path} ({type(exc).__name__})"
            ) from None
        return status, reader, writer, head

    async def _json(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        status, reader, writer, head = await self._request(method, path, body)
        try:
            lower = head.lower()
            if b"transfer-encoding: chunked" in lower:
                data = bytearray()
                while True:
                    size = int((await reader.readline()).strip() or b"0", 16)
                    if size == 0:
                        break
                    data += await reader.readexactly(size)
                    await reader.readline()
            else:
                data = await reader.read()
        finally:
            writer.close()
        text = bytes(data).decode(errors="replace").strip()
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, text

    async def exec_create(
        self, container_id: str, argv: list[str], *, user: str, workdir: str, env: dict[str, str], stdin: bool
    ) -> str:
        """Create an exec instance and return its id."""
        body = {
            "AttachStdin": stdin,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "Cmd": argv,
            "User": user,
            "WorkingDir": workdir,
            "Env": [f"{k}={v}" for k, v in env.items()],
        }
        status, data = await self._json("POST", f"/containers/{container_id}/exec", body)
        if status != 201:
            message = data.get("message") if isinstance(data, dict) else data
            raise SandboxError(
                f"docker exec failed: {message}", hint="the sandbox container may have died; acquire a new one"
            )
        return data["Id"]

    async def exec_stream(self, exec_id: str, stdin: bytes | None, stdout: OutputCap, stderr: OutputCap) -> None:
        """Start an exec, feed it stdin, and read its multiplexed output into the caps until it ends."""
        status, reader, writer, _ = await self._request(
            "POST", f"/exec/{exec_id}/start", {"Detach": False, "Tty": False}, upgrade=True
        )
        try:
            if status not in (101, 200):
                raise SandboxError(f"docker exec start answered HTTP {status}")
            feeder = asyncio.create_task(_feed(writer, stdin)) if stdin is not None else None
            sinks = {1: stdout, 2: stderr}
            try:
                while True:
                    try:
                        header = await reader.readexactly(8)
                    except asyncio.IncompleteReadError:
                        break
                    stream, size = header[0], struct.unpack(">I", header[4:])[0]
                    sink = sinks.get(stream, stdout)
                    while size:
                        chunk = await reader.read(min(size, _CHUNK))
                        if not chunk:
                            return
                        sink.feed(chunk)
                        size -= len(chunk)
            finally:
                if feeder is not None:
                    feeder.cancel()
        finally:
            writer.close()

    async def container_running(self, container_id: str) -> bool:
        """Whether the engine runs this container now (False when it is gone, stopped, or the engine is down)."""
        try:
            status, data = await self._json("GET", f"/containers/{container_id}/json")
        except SandboxError:
            return False
        return status == 200 and isinstance(data, dict) and bool((data.get("State") or {}).get("Running"))

    async def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        """The engine's state of an exec instance (ExitCode, Running, Pid)."""
        status, data = await self._json("GET", f"/exec/{exec_id}/json")
        if status != 200 or not isinstance(data, dict):
            raise SandboxError(f"docker exec inspect answered HTTP {status}")
        return data

    async def exit_code(self, exec_id: str) -> int:
        """The exit code of a finished exec (waits briefly while the engine records it)."""
        for _ in range(50):
            data = await self.exec_inspect(exec_id)
            if not data.get("Running"):
                code = data.get("ExitCode")
                return -1 if code is None else int(code)
            await asyncio.sleep(0.01)
        return -1


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    try:
        for start in range(0, len(data), _CHUNK):
            writer.write(data[start : start + _CHUNK])
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass  # the command exited without reading all of its stdin
