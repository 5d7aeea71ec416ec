"""Test helpers for the real vLLM server: fail (not skip) without it under `make test`, and start one via the CLI.

`make install` builds `.venv-vllm`; `make test` sets ENVHUB_REQUIRE_VLLM=1, so a missing vLLM fails the tests.
Elsewhere they skip with the reason. ENVHUB_VLLM_URL=http://127.0.0.1:N makes the tests use a server already
running (`envhub serve-engine --backend vllm --model tiny --rl-routes --api-key envhub-test-key --port N`) instead
of starting one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from envhub.errors import EngineError

REQUIRE_ENV = "ENVHUB_REQUIRE_VLLM"
TINY_KEY = "envhub-test-key"  # the API key of the shared tiny server (tests/trainer/conftest.py's `vllm_url`)
URL_ENV = "ENVHUB_VLLM_URL"


def vllm_required() -> bool:
    """True when tests must fail (not skip) without vLLM."""
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def require_vllm() -> Path:
    """The vLLM interpreter; fails the test under ENVHUB_REQUIRE_VLLM=1, skips it otherwise."""
    from envhub.trainer.engines.vllm.command import vllm_python

    try:
        return vllm_python()
    except EngineError as exc:
        if vllm_required():
            pytest.fail(f"{exc} ({REQUIRE_ENV}=1)", pytrace=False)
        pytest.skip(str(exc))
        raise


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class ServedVLLM:
    """One `serve-engine --backend vllm` process a test started (None: the server of $ENVHUB_VLLM_URL)."""

    url: str
    process: subprocess.Popen | None = None

    def stop(self) -> None:
        """SIGTERM the CLI, which stops the vLLM process group it started; wait for it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def serve_engines_vllm(count: int, *args: str, timeout: float = 900.0) -> Iterator[list[ServedVLLM]]:
    """Run `count` servers `envhub serve-engine --backend vllm ARGS` side by side (they start in parallel: two
    take ~75 s here against ~55 s for one); the first is $ENVHUB_VLLM_URL's when that is set."""
    served: list[ServedVLLM] = []
    if os.environ.get(URL_ENV):
        served.append(ServedVLLM(os.environ[URL_ENV].rstrip("/")))
    if len(served) < count:
        require_vllm()
    from envhub.trainer.engines.launcher import free_port

    logs = []
    try:
        while len(served) < count:
            port = free_port()
            log = tempfile.NamedTemporaryFile(prefix="envhub-serve-vllm-", suffix=".log", delete=False)
            logs.append(log.name)
            command = [
                sys.executable,
                "-m",
                "envhub.cli.main",
                "serve-engine",
                "--backend",
                "vllm",
                "--port",
                str(port),
            ]
            process = subprocess.Popen([*command, *args], stdout=log, stderr=subprocess.STDOUT)
            served.append(ServedVLLM(f"http://127.0.0.1:{port}", process))
        deadline = time.monotonic() + timeout
        for server, log_name in zip([s for s in served if s.process is not None], logs):
            while not _healthy(server.url):
                if server.process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"serve-engine --backend vllm did not come up:\n{Path(log_name).read_text()[-3000:]}")
                time.sleep(1.0)
        yield served
    finally:
        for server in served:
            server.stop()
        for log_name in logs:
            os.unlink(log_name)


@contextmanager
def serve_engine_vllm(*args: str, timeout: float = 900.0) -> Iterator[str]:
    """Run `envhub serve-engine --backend vllm ARGS` (or use $ENVHUB_VLLM_URL); yields the server's URL."""
    with serve_engines_vllm(1, *args, timeout=timeout) as served:
        yield served[0].url
