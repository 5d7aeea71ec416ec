"""`ExpertAgent`: the best play envhub knows for each bundled env (solvers, oracles, gold patches).

It reads the env's own state, so it needs the env object (`bind_env`), not just text: Sokoban,
FrozenLake, Wordle and Math through their `oracle_action()`, WebShop through `oracle_actions()`, the
turn games (SelfPlay) through the game's perfect/solver player, SWE by applying the instance's gold
patch and submitting, Letters by writing its letters. An oracle action that names one of the env's
tools ("bash[wc -l notes.txt]", "click[Buy Now]") is sent as that tool's call (`as_tool_call`).
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import numpy as np

from envhub.agents.base import Action, Agent, AgentError

_BRACKETED = re.compile(r"^\s*(\w+)\s*\[(.*)\]\s*$", re.DOTALL)


def as_tool_call(action: str, tools: list[dict[str, Any]] | None, *, only_named: bool = False) -> str:
    """An oracle's plain action ("right", "[crane]", "click[Buy Now]") as a call of the env's matching tool.

    `name[argument]` calls the tool `name`; any other action calls the env's only tool, unless `only_named`.
    Final answers written as text (anything with a `\\boxed{}`, e.g. Math's "4 x 9 = 36, ... \\boxed{71}") and
    written tool calls are returned unchanged.
    """
    functions = {t["function"]["name"]: t["function"] for t in tools or []}
    if "<tool_call>" in action:
        return action
    match = _BRACKETED.match(action)
    name, argument = (
        (match.group(1), match.group(2))
        if match and match.group(1) in functions
        else (None, action.strip().strip("[]"))
    )
    if name is None:
        if only_named or len(functions) != 1 or "\\boxed{" in action or action.strip().startswith("\\"):
            return action
        name = next(iter(functions))
    params = list(functions[name]["parameters"].get("properties", {}))
    if len(params) < 1:
        return action
    return _call(name, {params[0]: argument})


class ExpertAgent(Agent):
    """Plays each bundled env with its solver or oracle; other envs get a clear `no_expert` error."""

    name = "expert"

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self.env: Any = None
        self._plan: list[Action] = []
        self._planned = False
        self._rng = np.random.default_rng(seed)
        self._tools: list[dict[str, Any]] = []

    def bind_env(self, env: Any) -> None:
        self.env = getattr(env, "unwrapped", env)

    def reset(self, info: dict[str, Any]) -> None:
        self._plan, self._planned = [], False
        self._tools = list(info.get("tools") or [])
        self._rng = np.random.default_rng(info.get("agent_seed", self.seed))

    async def act(self, observation: str, info: dict[str, Any]) -> Action:
        env = self.env
        if env is None:
            raise AgentError(
                "no_expert",
                "the expert agent needs the env object",
                hint="call bind_env(env) before reset (local envs only)",
            )
        if not self._planned:
            self._plan, self._planned = self._make_plan(env), True
        if self._plan:
            return self._plan.pop(0)
        game = getattr(env, "game", None)
        if game is not None and hasattr(game, "solver_action"):
            return game.move_name(int(game.solver_action(self._rng)))
        if hasattr(env, "oracle_action"):
            action = env.oracle_action()
            if action is None:
                raise AgentError("expert_stuck", f"the {type(env).__name__} solver found no move from this state")
            if not isinstance(action, str):  # a structured call ({"name", "arguments"}) goes as it is
                return action
            return as_tool_call(action, self._tools, only_named=True)
        raise AgentError(
            "no_expert",
            f"no expert for {type(env).__name__}",
            hint="experts exist for the bundled envs with a solver, oracle or gold patch",
        )

    def _make_plan(self, env: Any) -> list[Action]:
        """A whole episode's actions, for envs whose expert is a fixed script."""
        if hasattr(env, "oracle_actions"):  # WebShop
            return list(env.oracle_actions())
        instance = getattr(env, "instance", None)
        if instance is not None and getattr(instance, "patch", None):  # SWE: apply the gold patch, then submit
            encoded = base64.b64encode(instance.patch.encode()).decode()
            apply = f"echo {encoded} | base64 -d | git apply --whitespace=nowarn - && git status --short"
            return [_call("bash", {"command": apply}), _call("submit", {})]
        letters = getattr(env, "letters", None)
        if isinstance(letters, (set, frozenset)) and type(env).__name__ == "LettersEnv":
            return ["".join(sorted(letters))] * 64
        return []


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
