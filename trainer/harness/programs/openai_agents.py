"""The `openai-agents` built-in harness: the OpenAI Agents SDK, unmodified, with its defaults (the Responses API,
the client from OPENAI_BASE_URL and OPENAI_API_KEY); it answers ENVHUB_TASK, with the env's tools from
ENVHUB_MCP_URL when there is one, and prints its final output last."""

import asyncio
import os

from agents import Agent, ModelSettings, Runner


async def main() -> None:
    """Run the agent once on the task, with the episode's MCP server when the env has tools."""
    servers = []
    if os.environ.get("ENVHUB_MCP_URL"):
        from agents.mcp import MCPServerStreamableHttp

        key = os.environ["OPENAI_API_KEY"]
        params = {"url": os.environ["ENVHUB_MCP_URL"], "headers": {"Authorization": f"Bearer {key}"}}
        servers.append(MCPServerStreamableHttp(params=params, cache_tools_list=True))
    for server in servers:
        await server.connect()
    try:
        max_tokens = int(os.environ["ENVHUB_MAX_TOKENS"]) if "ENVHUB_MAX_TOKENS" in os.environ else None
        agent = Agent(
            name="envhub",
            instructions=os.environ["ENVHUB_INSTRUCTIONS"],
            model=os.environ["OPENAI_MODEL"],
            model_settings=ModelSettings(max_tokens=max_tokens),  # None: the gateway's own per-request limit
            mcp_servers=servers,
        )
        turns = int(os.environ.get("ENVHUB_MAX_TURNS", "4"))
        result = await Runner.run(agent, os.environ["ENVHUB_TASK"], max_turns=turns)
        print(result.final_output)
    finally:
        for server in servers:
            await server.cleanup()


asyncio.run(main())
