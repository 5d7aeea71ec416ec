"""The env's tools for one episode over MCP (streamable HTTP, JSON responses): `POST /mcp` with the episode's key.

A harness lists the env's tools (`tools/list`) and calls them (`tools/call`); each call is one env step, run by
the episode's `EpisodeTools` (set by whoever opened the episode, e.g. `HarnessEnv`). Served: `initialize`, `ping`,
`tools/list`, `tools/call`; notifications and client responses are accepted with 202; GET (a server-to-client
stream) answers 405, which the transport allows. Batches are refused by the trust layer, which takes JSON objects
only (batching left the protocol in 2025-06-18).
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from envhub.trainer.gateway.episodes import EPISODE

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")  #: newest first
_PARSE, _INVALID, _NO_METHOD, _BAD_PARAMS = -32700, -32600, -32601, -32602


class EpisodeTools(Protocol):
    """An episode's tools: their MCP descriptions and a call of one (its text, and whether it failed)."""

    def list(self) -> list[dict[str, Any]]: ...

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]: ...


def mcp_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool description from an OpenAI-style function schema (envhub's `info["tools"]`)."""
    function = schema.get("function", schema)
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {"name": function["name"], "description": function.get("description", ""), "inputSchema": parameters}


def _reply(message_id: Any, result: dict[str, Any] | None = None, error: tuple[int, str] | None = None) -> web.Response:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": message_id}
    if error is not None:
        body["error"] = {"code": error[0], "message": error[1]}
    else:
        body["result"] = result or {}
    return web.json_response(body)


async def _post(gateway: Any, request: web.Request) -> web.Response:
    episode = request[EPISODE]
    message = await gateway.guard.read_json(request)  # the trust layer's body size, deadline and nesting bounds
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return _reply(None, error=(_INVALID, "send one JSON-RPC 2.0 message (batches are not supported)"))
    method, message_id = message.get("method"), message.get("id")
    if method is None or message_id is None:
        return web.Response(status=202)  # a notification or a response to us: nothing to answer
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    tools: EpisodeTools | None = episode.tools
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        capabilities = {"tools": {"listChanged": False}} if tools else {}
        info = {"name": "envhub", "version": "1"}
        return _reply(message_id, {"protocolVersion": version, "capabilities": capabilities, "serverInfo": info})
    if method == "ping":
        return _reply(message_id)
    if method == "tools/list":
        return _reply(message_id, {"tools": tools.list() if tools else []})
    if method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments") or {}
        if tools is None or not isinstance(name, str) or not isinstance(arguments, dict):
            return _reply(message_id, error=(_BAD_PARAMS, "tools/call needs a tool's name and an arguments object"))
        if name not in {tool["name"] for tool in tools.list()}:
            return _reply(message_id, error=(_BAD_PARAMS, f"unknown tool {name[:100]!r}; tools/list names them"))
        text, failed = await tools.call(name, arguments)
        return _reply(message_id, {"content": [{"type": "text", "text": text}], "isError": failed})
    return _reply(message_id, error=(_NO_METHOD, f"method {str(method)[:100]!r} is not served here"))


def add_routes(app: web.Application, gateway: Any) -> None:
    """POST /mcp (JSON-RPC), GET and DELETE /mcp answered 405."""

    async def post(request: web.Request) -> web.Response:
        return await _post(gateway, request)

    async def not_here(request: web.Request) -> web.Response:
        return web.Response(status=405, headers={"Allow": "POST"})

    app.router.add_post("/mcp", post)
    app.router.add_get("/mcp", not_here)
    app.router.add_delete("/mcp", not_here)
