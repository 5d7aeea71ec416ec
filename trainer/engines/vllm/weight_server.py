"""Weights from the learner to vLLM servers without a shared disk: the trainer serves each push over HTTP.

`WeightServer` keeps the latest pushed state dict as one safetensors file in memory and serves it at
`GET /weights/v<version>` to holders of its bearer token (a fresh random one per run; any other request gets 401,
an older version 404). Each vLLM server fetches it into its own workers through envhub's worker extension
(`worker_extension/envhub_vllm_weights.py`, called over vLLM's `/collective_rpc`) and reloads in place, so
servers on other hosts need no filesystem in common with the learner, only a route to it. One server is shared
by every engine of a run: a version is serialised once, however many servers fetch it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from envhub.errors import EngineError
from envhub.trainer.engines.server.security import bearer_matches

ROUTE = "/weights/v{version}"


class WeightServer:
    """The latest weights over HTTP for the run's vLLM servers (`start`, `publish`, `stop`)."""

    def __init__(self, bind: str = "127.0.0.1", host: str = "", port: int = 0) -> None:
        self.bind = bind
        self.host = host or bind  #: the address the vLLM servers reach this one at
        self.port = port
        self.token = secrets.token_urlsafe(24)
        self.version: int | None = None
        self.fetches = 0  #: successful GETs of a version (every server fetches each push once)
        self._blob = b""
        self._lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Base URL of this server, as the vLLM servers reach it."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> WeightServer:
        """Listen on `bind` (port 0: a free one)."""
        app = web.Application()
        app.router.add_get("/weights/v{version:[0-9]+}", self._get)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.bind, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise EngineError(
                f"the weight server cannot listen on {self.bind}:{self.port}: {exc}",
                hint="set engine.group_address to an address of this machine the vLLM servers reach",
            ) from exc
        self.port = self._runner.addresses[0][1]
        return self

    async def publish(self, version: int, state: Mapping[str, Any]) -> str:
        """Serve `state` as `version` (serialised once; the previous version is dropped); returns its URL."""
        async with self._lock:
            if self.version != version:
                self._blob = await asyncio.to_thread(serialize, state)
                self.version = version
        return self.url + ROUTE.format(version=version)

    async def _get(self, request: web.Request) -> web.StreamResponse:
        if not bearer_matches(request.headers.get("Authorization"), self.token):
            return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        version = int(request.match_info["version"])
        if version != self.version:
            return web.json_response(
                {"error": f"version {version} is not served (the latest is {self.version})"}, status=404
            )
        self.fetches += 1
        return web.Response(body=self._blob, content_type="application/octet-stream")

    async def stop(self) -> None:
        """Stop listening and drop the weights."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._blob = b""


def serialize(state: Mapping[str, Any]) -> bytes:
    """A state dict as the bytes of one safetensors file (CPU, contiguous; tied weights stored twice)."""
    from safetensors.torch import save

    from envhub.trainer.engines.vllm.weights import plain_tensors

    return save(plain_tensors(state))
