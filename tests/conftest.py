"""Shared fixtures: a real envhub HTTP server on a free 127.0.0.1 port."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

# Tests never reach a hub (CI has none): hub clients fail at once instead of retrying the network for ~25 s each
# (GEM's hub-data envs, SWE hub names). Set before `datasets` / `huggingface_hub` read it at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

pytest_plugins = ["envhub.sandboxes.testing"]  # shared sandbox pool fixtures


@dataclass
class RunningServer:
    """An env server (`EnvServer` or `OpenEnvServer`) serving on a background thread's event loop."""

    url: str
    server: object
    loop: asyncio.AbstractEventLoop


def start_server(protocol: str = "envhub", **limits) -> tuple[RunningServer, callable]:
    """Start an EnvServer (or, for protocol "openenv", an OpenEnvServer: pass env_id) on 127.0.0.1 (port chosen by
    the OS); returns it and a stop function."""
    from aiohttp import web

    from envhub.server.env_server import EnvServer
    from envhub.server.openenv_server import OpenEnvServer

    server = OpenEnvServer(**limits) if protocol == "openenv" else EnvServer(**limits)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder = {}

    async def serve():
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"], holder["port"] = runner, runner.addresses[0][1]
        started.set()

    thread = threading.Thread(target=loop.run_forever, name="envhub-test-server", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(timeout=10)
    started.wait(10)

    def stop():
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

    return RunningServer(f"http://127.0.0.1:{holder['port']}", server, loop), stop


@pytest.fixture(scope="session")
def env_server() -> Iterator[RunningServer]:
    """One envhub server for the whole test session."""
    running, stop = start_server(idle_timeout=600, max_sessions=500)
    yield running
    stop()
