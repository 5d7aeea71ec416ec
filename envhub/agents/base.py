"""The `Agent` interface and the random baseline.

An agent acts in one episode at a time: `reset(info)` with the env's reset `info`, then
`await act(observation, info)` once per step, returning raw text or an OpenAI-style assistant
message dict (`{"content": ..., "tool_calls": [...]}`), which every envhub env accepts as an action.
Agents that need the env itself (solvers, oracles) get it through `bind_env(env)` before `reset`.
"""

from __future__ import annotations

import json
import random
from typing import Any

from envhub.errors import EnvhubError

Action = str | dict[str, Any]

RANDOM_WORDS = ("up", "down", "left", "right", "crane", "house", "plant", "ghost", "maybe", "hello", "answer", "box")


class AgentError(EnvhubError):
    """An agent that could not produce an action; `kind` names the family (auth, rate_limit, server, ...)."""

    def __init__(self, kind: str, message: str, hint: str = "") -> None:
        super().__init__(message, hint)
        self.kind = kind


class Agent:
    """Anything that acts in an env: `reset(info)` once per episode, then `await act(observation, info)`."""

    #: Short name written into evaluation records.
    name: str = "agent"

    def bind_env(self, env: Any) -> None:
        """Called with the env before `reset`; only agents that read env state (experts) use it."""

    def reset(self, info: dict[str, Any]) -> None:
        """Start an episode; `info` is the env's reset info (system prompt, tools, task metadata)."""

    async def act(self, observation: str, info: dict[str, Any]) -> Action:
        """The action for `observation`; `info` is the latest info the env returned."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what the agent holds (HTTP clients)."""

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class RandomAgent(Agent):
    """Random legal actions: one of the env's `info["legal_actions"]` (the contract in docs/authoring.md) or a
    turn game's legal moves when the env lists them; else a shop element, a dictionary word, or a tool call with
    random arguments.

    Seeded by `info["agent_seed"]` at reset (the evaluator sets it), else by `seed`.
    """

    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.tools: list[dict[str, Any]] = []

    def reset(self, info: dict[str, Any]) -> None:
        seed = info.get("agent_seed", self.seed)
        self.rng = random.Random(seed)
        self.tools = list(info.get("tools") or [])

    async def act(self, observation: str, info: dict[str, Any]) -> Action:
        rng = self.rng
        legal = info.get("legal_actions") or info.get("legal_moves")  # the env's list, then SelfPlay's older name
        if legal:
            return str(rng.choice(list(legal)))
        if info.get("available_actions") or info.get("has_search"):  # the web shop
            labels = list(info.get("available_actions") or [])
            if info.get("has_search") and (not labels or rng.random() < 0.5):
                return f"search[{' '.join(rng.choice(RANDOM_WORDS) for _ in range(2))}]"
            return f"click[{rng.choice(labels)}]"
        names = {t["function"]["name"] for t in self.tools}
        if "guess" in names:  # Wordle: a real word, so the guess counts
            from envhub.envs.wordle import word_list

            return _tool_call("guess", {"word": rng.choice(word_list())})
        if not self.tools:
            return " ".join(rng.choice(RANDOM_WORDS) for _ in range(rng.randint(1, 4)))
        function = rng.choice(self.tools)["function"]
        arguments = {name: self._value(schema) for name, schema in function["parameters"]["properties"].items()}
        return _tool_call(function["name"], arguments)

    def _value(self, schema: dict[str, Any]) -> Any:
        if "enum" in schema:
            return self.rng.choice(schema["enum"])
        if schema.get("type") in ("integer", "number"):
            return self.rng.randint(0, 100)
        return self.rng.choice((*RANDOM_WORDS, str(self.rng.randint(0, 100))))


def _tool_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
