"""An env's tools as one harness episode's MCP tools: each `tools/call` is one env step with that call as its
action; the steps' rewards add up to the episode's reward, and calls after the env ends are refused."""

from __future__ import annotations

import asyncio
from typing import Any

from envhub.core import AgentEnv
from envhub.trainer.gateway.mcp import mcp_tool


class EnvTools:
    """The `EpisodeTools` of one episode of `env` (already reset), whose tools are `schemas` (info["tools"])."""

    def __init__(self, env: AgentEnv, schemas: list[dict[str, Any]]) -> None:
        self.env = env
        self.tools = [mcp_tool(schema) for schema in schemas]
        self.reward = 0.0
        self.steps = 0
        self.done = False
        self.info: dict[str, Any] = {}
        self._lock = asyncio.Lock()  # a harness calling tools in parallel still steps the env one call at a time

    @property
    def names(self) -> set[str]:
        """The tools' names."""
        return {tool["name"] for tool in self.tools}

    def list(self) -> list[dict[str, Any]]:
        """The env's tools as MCP describes them."""
        return self.tools

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """One env step with the call as its action: the observation, and whether the episode had already ended."""
        async with self._lock:
            if self.done:
                return "The episode is over: the env accepts no more tool calls. Exit to end the episode.", True
            obs, reward, terminated, truncated, info = await self.env.astep({"name": name, "arguments": arguments})
            self.steps += 1
            self.reward += float(reward)
            self.done = bool(terminated or truncated)
            self.info = info
            return obs, False
