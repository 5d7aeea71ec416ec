"""Headless Chromium driven over the DevTools protocol (aiohttp websocket): pages with scripts off, and clicks.

Chromium's own switches do not serve for a page without scripts: `--disable-javascript` leaves scripts running and
`--blink-settings=scriptEnabled=false` stops `--dump-dom` and `--screenshot` (they run script themselves). So the
page's scripts are turned off with `Emulation.setScriptExecutionDisabled`, and the DOM and a screenshot are read
through the protocol.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import re
import tempfile
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from envhub.envs.web import browser


class DevToolsPage:
    """One page of a running Chromium: send protocol commands, wait for events."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Run one command and return its result (events that arrive meanwhile are kept)."""
        call_id = next(self.ids)
        await self.socket.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = await self.socket.receive_json(timeout=60)
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    async def wait_for(self, event: str) -> dict[str, Any]:
        """The first `event` since the last wait (the `send` calls before it may have seen it already)."""
        while not any(e.get("method") == event for e in self.events):
            self.events.append(await self.socket.receive_json(timeout=60))
        found = next(e for e in self.events if e.get("method") == event)
        self.events = self.events[self.events.index(found) + 1 :]
        return found

    async def load(self, url: str) -> None:
        """Navigate and wait until the page's load event."""
        await self.send("Page.navigate", url=url)
        await self.wait_for("Page.loadEventFired")

    async def dom(self) -> str:
        """The document's HTML as it stands."""
        root = await self.send("DOM.getDocument", depth=-1)
        return (await self.send("DOM.getOuterHTML", nodeId=root["root"]["nodeId"]))["outerHTML"]

    async def box(self, selector: str) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) in CSS pixels of the first element matching `selector`."""
        root = (await self.send("DOM.getDocument"))["root"]["nodeId"]
        node = (await self.send("DOM.querySelector", nodeId=root, selector=selector))["nodeId"]
        if not node:
            raise LookupError(f"no element matches {selector!r}")
        quad = (await self.send("DOM.getBoxModel", nodeId=node))["model"]["border"]
        return round(quad[0]), round(quad[1]), round(quad[4]), round(quad[5])

    async def evaluate(self, expression: str) -> Any:
        """The value of a script run in the page (a promise is awaited)."""
        result = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self) -> bytes:
        """A PNG of the viewport."""
        return base64.b64decode((await self.send("Page.captureScreenshot", format="png"))["data"])


@asynccontextmanager
async def chromium_page(width: int = 1200, height: int = 800, scripts: bool = True):
    """A blank page of a fresh headless Chromium (whose pages run no script unless `scripts`)."""
    with tempfile.TemporaryDirectory() as profile:
        process = await asyncio.create_subprocess_exec(
            browser.find_chromium(),
            *browser._FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            port = await asyncio.wait_for(_devtools_port(process), timeout=60)
            async with aiohttp.ClientSession() as session:
                targets = await (await session.get(f"http://127.0.0.1:{port}/json/list")).json()
                url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
                async with session.ws_connect(url, max_msg_size=64 << 20) as socket:
                    page = DevToolsPage(socket)
                    await page.send("Page.enable")
                    await page.send("Emulation.setScriptExecutionDisabled", value=not scripts)
                    size = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
                    await page.send("Emulation.setDeviceMetricsOverride", **size)
                    yield page
        finally:
            process.kill()
            await process.wait()


async def _devtools_port(process: asyncio.subprocess.Process) -> int:
    """The port Chromium prints on stderr once its DevTools server listens."""
    while line := await process.stderr.readline():
        if match := re.search(rb"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line):
            asyncio.get_running_loop().create_task(_drain(process.stderr))  # keep the pipe from filling up
            return int(match.group(1))
    raise RuntimeError("Chromium exited before its DevTools server started")


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(1 << 16):
        pass
