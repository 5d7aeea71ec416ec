"""Shared fixtures: a real envhub HTTP server on a free 127.0.0.1 port."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

# Tests never reach a hub (CI has none): hub clients fail at once instead of retrying the network for ~25 s each
# (GEM's hub-data envs, SWE hub names). Set before `datasets` / `huggingface_hub` read it at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

pytest_plugins = ["envhub.sandboxes.testing"]  # shared sandbox pool fixtures


def default_sigint() -> None:
    """`preexec_fn` of a child that a test interrupts as a person's Ctrl-C would: the pytest process (an xdist
    worker, or an earlier test) may have SIGINT ignored or blocked, and a child inherits both across exec."""
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


@pytest.fixture(autouse=True)
def _sys_path_as_it_was() -> Iterator[None]:
    """sys.path restored after each test. A test that imports a user's module by path in-process (a config's
    `imports`, `--import ./kind.py`) puts the module's folder first on sys.path, as envhub must for the user; left
    there, a folder of tests/ named like a package (tests/trainer/engines/sglang, .../vllm) shadowed the installed
    one for every later test on that worker (SGLang's own modules and TRL's vLLM probe failed to import)."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker (`make test` runs several), torch computes on one thread: two workers of two OpenMP
    threads each on two cores would spin against each other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        try:
            import torch
        except ImportError:
            return
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The measured slowest tests first, longest first (tests/durations.py), so no worker ends the run alone."""
    from tests.durations import load, longest_first

    items[:] = longest_first(items, load())


def pytest_collection_finish(session: pytest.Session) -> None:
    """Stop at once when xdist's loadgroup did not group the `xdist_group` tests (as with pytest 9.2 and xdist 3.8):
    the vLLM tests would then start servers on every worker and race over /dev/shm."""
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist workers only
        return
    ungrouped = [
        item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if ungrouped:
        pytest.exit(f"xdist_group marks were ignored ({ungrouped[0]} has no @group): check the pytest/xdist pins", 3)
