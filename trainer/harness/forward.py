"""The in-sandbox forwarder: listens on 127.0.0.1:PORT inside the sandbox's own network namespace, relays each
connection to the gateway's unix socket (bind-mounted into the sandbox), runs the harness command as its child and
exits with the child's status.

It is copied into the sandbox and run by the sandbox's own `python3`, so it uses the standard library alone
(Python 3.8+). Usage: `python3 forward.py SOCKET PORT -- COMMAND...`.
"""

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


async def _relay(socket_path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.open_unix_connection(socket_path)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))


async def main(socket_path: str, port: int, command: list) -> int:
    """Serve the relay, run `command`, return its exit status."""
    server = await asyncio.start_server(lambda r, w: _relay(socket_path, r, w), "127.0.0.1", port)
    child = await asyncio.create_subprocess_exec(*command)  # stdout and stderr are the sandbox command's own
    status = await child.wait()
    server.close()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit("usage: forward.py SOCKET PORT -- COMMAND...")
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[4:])))
