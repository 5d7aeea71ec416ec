"""An episode's env tools over MCP at /mcp, checked with the `mcp` package's own streamable-HTTP client."""

from __future__ import annotations

import pytest

from tests.trainer.gateway.conftest import ADD

mcp = pytest.importorskip("mcp")
httpx2 = pytest.importorskip("httpx2")


class AddTools:
    """Episode tools that add (their calls recorded)."""

    def __init__(self) -> None:
        self.calls = []

    def list(self):
        from envhub.trainer.gateway.mcp import mcp_tool

        return [mcp_tool({"type": "function", "function": ADD})]

    async def call(self, name, arguments):
        self.calls.append((name, arguments))
        return str(arguments["a"] + arguments["b"]), False


async def test_a_real_mcp_client_lists_and_calls_the_episode_tools(gateway):
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    tools = AddTools()
    handle = gateway.open_episode(tools=tools)
    url = handle.env()["ENVHUB_MCP_URL"]
    assert url == gateway.url.removesuffix("/v1") + "/mcp"
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {handle.api_key}"}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                assert [t.name for t in listed.tools] == ["add"]
                assert listed.tools[0].input_schema["required"] == ["a", "b"]
                result = await session.call_tool("add", {"a": 2, "b": 3})
                assert not result.is_error and result.content[0].text == "5"
    assert tools.calls == [("add", {"a": 2, "b": 3})]
    gateway.close_episode(handle)


async def test_mcp_refuses_strangers_and_bad_calls(gateway):
    import aiohttp

    handle = gateway.open_episode(tools=AddTools())
    url = gateway.url.removesuffix("/v1") + "/mcp"
    key = {"Authorization": f"Bearer {handle.api_key}"}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "rm", "arguments": {}}}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=call) as response:
            assert response.status == 401  # no key: no tools
        async with http.post(url, json=call, headers=key) as response:
            assert (await response.json())["error"]["message"].startswith("unknown tool 'rm'")
        async with http.post(url, json=[call], headers=key) as response:
            assert response.status == 400  # a batch: the trust layer takes JSON objects only
        async with http.post(url, json={"id": 3, "method": "ping"}, headers=key) as response:
            assert "one JSON-RPC 2.0 message" in (await response.json())["error"]["message"]
        async with http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "resources/list"}, headers=key) as r:
            assert (await r.json())["error"]["code"] == -32601
        async with http.get(url, headers=key) as response:
            assert response.status == 405
        gateway.close_episode(handle)
        async with http.post(url, json=call, headers=key) as response:
            assert response.status == 401  # the episode is over
