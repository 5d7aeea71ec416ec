"""Agents: one interface for anything that acts in an env (`reset(info)`, `async act(observation, info)`).

`RandomAgent` and `ExpertAgent` are baselines, `ChatAgent` asks any OpenAI-compatible endpoint,
`EngineAgent` runs an `InferenceEngine` with the rollout's chat-template code. The CLI builds agents from
specs (`random`, `expert`, `openai:URL[#model]`, `hf:DIR`, `smollm2`) in `envhub.cli.agent_spec`. Heavy
parts (openai, torch) load only when an agent needs them.
"""

from envhub.agents.base import Action, Agent, AgentError, RandomAgent
from envhub.agents.expert import ExpertAgent

__all__ = [
    "Action",
    "Agent",
    "AgentError",
    "ChatAgent",
    "ChatEndpoint",
    "EngineAgent",
    "ExpertAgent",
    "RandomAgent",
]


def __getattr__(name: str):  # ChatAgent needs openai and EngineAgent torch: import them on first use
    if name in ("ChatAgent", "ChatEndpoint"):
        from envhub.agents import chat

        return getattr(chat, name)
    if name == "EngineAgent":
        from envhub.agents.engine import EngineAgent

        return EngineAgent
    raise AttributeError(f"module 'envhub.agents' has no attribute {name!r}")
