"""Chat-format expert trajectories for the SFT warm start (`envhub collect`, in envhub/cli/collect.py).

Each line: {"env", "seed", "reward", "tools", "messages": [system, user, assistant, user, ...]}, where assistant
messages are the agent's raw text (tool calls as `<tool_call>{json}</tool_call>`, the rollout's format), so
`envhub.trainer.sft` can lay them out with the rollout's own chat-template code.

The expert is `envhub.agents.ExpertAgent` (the env's solver, oracle or gold patch); its plain actions are
written as calls of the env's tools (`as_tool_call`), dict actions as `<tool_call>{json}</tool_call>`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envhub.agents.base import AgentError
from envhub.agents.expert import ExpertAgent, as_tool_call
from envhub.errors import ConfigError


def make_agent(kind: str, env: Any, seed: int = 0) -> Any:
    """The agent named on the command line, bound to `env`."""
    if kind == "expert":
        agent = ExpertAgent(seed=seed)
        agent.bind_env(env)
        return agent
    raise ConfigError(f"unknown agent {kind!r}", hint="use --agent expert")


def as_text(action: Any, tools: list[dict[str, Any]] | None) -> str:
    """The assistant message for an agent's action, in the rollout's tool-call format."""
    if isinstance(action, dict):
        call = {"name": action.get("name"), "arguments": action.get("arguments", {})}
        return f"<tool_call>{json.dumps(call)}</tool_call>"
    return as_tool_call(str(action), tools)


@dataclass
class Demonstration:
    """One recorded episode in chat format."""

    env: str
    seed: int
    reward: float
    messages: list[dict[str, str]]
    tools: list[dict[str, Any]] = field(default_factory=list)


async def collect_episode(
    env_id: str, seed: int, agent_kind: str = "expert", max_turns: int = 32, env_kwargs: dict[str, Any] | None = None
) -> Demonstration:
    """Play one episode with the agent, recording the conversation as the rollout would present it.

    `max_turns` caps the collector; `env_kwargs` go to the env (kept apart: an env's own `max_turns` is its kwarg)."""
    import envhub

    env = envhub.make(env_id, **(env_kwargs or {}))
    try:
        agent = make_agent(agent_kind, env, seed)
        obs, info = await env.areset(seed=seed)
        agent.reset({**info, "agent_seed": seed})
        tools = info.get("tools")
        messages = [{"role": "system", "content": info["system_prompt"]}] if info.get("system_prompt") else []
        messages.append({"role": "user", "content": obs})
        total = 0.0
        for _ in range(max_turns):
            try:
                action = as_text(await agent.act(obs, info), tools)
            except AgentError as exc:
                if exc.kind == "no_expert":
                    raise ConfigError(
                        f"{env_id} has no solver for --agent {agent_kind}: {exc}",
                        hint="collect expert data from an env with a solver, e.g. Sokoban-v0, FrozenLake-v0, "
                        "ShellQuiz-v0",
                    ) from None
                break  # the solver is stuck: the episode ends here, as played
            messages.append({"role": "assistant", "content": action})
            obs, reward, terminated, truncated, info = await env.astep(action)
            total += float(reward)
            if terminated or truncated:
                break
            messages.append({"role": "user", "content": obs})
        return Demonstration(env_id, seed, total, messages, list(info.get("tools") or []) or list(_tools(env)))
    finally:
        await env.aclose() if hasattr(env, "aclose") else env.close()


def _tools(env: Any) -> list[dict[str, Any]]:
    return [t.schema for t in getattr(env.unwrapped, "tools", ())]


async def collect(
    env_id: str,
    n: int,
    out: str | Path,
    agent: str = "expert",
    seed: int = 0,
    min_reward: float | None = None,
    *,
    max_turns: int = 32,
    env_kwargs: dict[str, Any] | None = None,
) -> list[Demonstration]:
    """Collect `n` episodes (seeds seed..seed+n-1) into `out` (JSONL, one line written and flushed per episode)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = []
    with out.open("w", encoding="utf-8") as f:
        for s in range(seed, seed + n):
            demo = await collect_episode(env_id, s, agent, max_turns, env_kwargs)
            if min_reward is not None and demo.reward < min_reward:
                continue
            f.write(json.dumps(asdict(demo)) + "\n")
            f.flush()
            kept.append(demo)
    return kept
