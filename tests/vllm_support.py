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


@contextmanager
def serve_engine_vllm(*args: str, timeout: float = 900.0) -> Iterator[str]:
    """Run `envhub serve-engine --backend vllm ARGS` (or use $ENVHUB_VLLM_URL); yields the server's URL."""
    if os.environ.get(URL_ENV):
        yield os.environ[URL_ENV].rstrip("/")
        return
    require_vllm()
    from envhub.trainer.engines.launcher import free_port

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="envhub-serve-vllm-", suffix=".log", delete=False)
    command = [sys.executable, "-m", "envhub.cli.main", "serve-engine", "--backend", "vllm", "--port", str(port)]
    process = subprocess.Popen([*command, *args], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"serve-engine --backend vllm did not come up:\n{Path(log.name).read_text()[-3000:]}")
            time.sleep(1.0)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)  # the CLI stops the vLLM process group it started
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        os.unlink(log.name)
