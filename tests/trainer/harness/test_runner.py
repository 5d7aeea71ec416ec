"""The sandboxed runner: from inside, the gateway answers and every other port of the host is unreachable."""

from __future__ import annotations

import asyncio
import json

from envhub.trainer.harness import HarnessEnv
from tests.trainer.harness.conftest import AddEnv
from tests.trainer.harness.scripts import PROBE, command


async def test_inside_the_sandbox_only_the_gateway_answers(gateway, base_rootfs):
    accepted = []
    other = await asyncio.start_server(lambda r, w: accepted.append(w.close()), "127.0.0.1", 0)
    other_port = other.sockets[0].getsockname()[1]
    gateway_port = int(gateway.url.rsplit(":", 1)[1].split("/")[0])
    try:
        # control: the other server does accept connections from the host
        _, writer = await asyncio.open_connection("127.0.0.1", other_port)
        writer.close()
        episode = await HarnessEnv(AddEnv, command(PROBE, gateway_port, other_port), gateway, wall_clock_s=60).play()
    finally:
        other.close()
    assert episode.error is None, episode.error
    assert len(episode.calls) == 1  # the gateway answered through the forwarder
    assert json.loads(episode.action)["reached"] == {str(gateway_port): False, str(other_port): False}
    assert len(accepted) == 1  # only the host's own control connection got through
