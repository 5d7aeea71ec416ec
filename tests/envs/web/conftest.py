"""Shared fixtures for the web shop tests: one real shop server per test module."""

import pytest

from envhub.envs.web import acquire_server, release_server


@pytest.fixture(scope="module")
def shop_server():
    """The process's shared shop server (real aiohttp on 127.0.0.1), held for the module."""
    server = acquire_server()
    yield server
    release_server(server)
