"""Fixtures of the server tests: real env servers of either protocol on 127.0.0.1."""

from __future__ import annotations

import pytest

from tests.conftest import start_server


@pytest.fixture
def serve():
    """start(protocol="envhub", **server kwargs) -> RunningServer; every server started is stopped at the end."""
    stops = []

    def start(protocol: str = "envhub", **kwargs):
        running, stop = start_server(protocol, **kwargs)
        stops.append(stop)
        return running

    yield start
    for stop in stops:
        stop()
