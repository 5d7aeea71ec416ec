"""Agent specs as the CLI writes them: `random`, `expert`, `openai:URL[#model]`, `hf:DIR`, `smollm2`.

A spec names a kind of agent plus the resource its episodes share (an HTTP client, a loaded model), so
`make_agent_factory` returns an `AgentFactory`: call it for a fresh agent per episode, `aclose()` it at the end.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from envhub.agents.base import Agent, RandomAgent
from envhub.agents.expert import ExpertAgent
from envhub.errors import ConfigError

SPEC_HELP = "use random, expert, openai:URL[#model], hf:DIR or smollm2"


class AgentSpecError(ConfigError):
    """An agent spec that names no known kind of agent."""


@dataclass
class AgentFactory:
    """Makes one agent per episode; agents of a factory share its client or model."""

    spec: str
    make: Callable[[], Agent]
    close: Callable[[], Awaitable[None]] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Agent:
        return self.make()

    async def aclose(self) -> None:
        """Release the shared client or engine."""
        if self.close is not None:
            await self.close()


def make_agent_factory(
    spec: str,
    *,
    api_key: str | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    tool_mode: str = "auto",
    context_chars: int = 32_000,
    max_total_tokens: int = 4096,
    device: str | None = None,
    max_retries: int = 5,
) -> AgentFactory:
    """An `AgentFactory` for `spec`; a spec that names nothing known raises one clear `AgentSpecError`."""
    spec = spec.strip()
    if spec == "random":
        return AgentFactory(spec, RandomAgent)
    if spec == "expert":
        return AgentFactory(spec, ExpertAgent)
    if spec.startswith("openai:"):
        from envhub.agents.chat import ChatAgent, ChatEndpoint, normalize_base_url

        url, _, model = spec.removeprefix("openai:").partition("#")
        if not url:
            raise AgentSpecError(
                f"agent spec {spec!r} has no URL", hint="e.g. openai:http://127.0.0.1:8000/v1#my-model"
            )
        try:
            endpoint = ChatEndpoint(normalize_base_url(url), model or None, api_key)
        except Exception as exc:
            raise AgentSpecError(f"agent spec {spec!r}: {exc}", hint=SPEC_HELP) from None

        def chat() -> Agent:
            return ChatAgent(
                endpoint,
                temperature=temperature,
                max_tokens=max_tokens,
                tool_mode=tool_mode,
                context_chars=context_chars,
                max_retries=max_retries,
            )

        return AgentFactory(spec, chat, endpoint.aclose, {"base_url": endpoint.base_url, "model": model or None})
    if spec == "smollm2" or spec.startswith("hf:"):
        model = "smollm2" if spec == "smollm2" else spec.removeprefix("hf:")
        if not model:
            raise AgentSpecError(f"agent spec {spec!r} has no directory", hint="e.g. hf:/path/to/hf-model-dir")
        return engine_factory(
            spec,
            model,
            max_tokens=max_tokens,
            temperature=temperature,
            max_total_tokens=max_total_tokens,
            device=device,
        )
    raise AgentSpecError(f"unknown agent spec {spec!r}", hint=SPEC_HELP)


def engine_factory(
    spec: str, model: str, *, max_tokens: int, temperature: float, max_total_tokens: int, device: str | None = None
) -> AgentFactory:
    """Agents over one embedded `EmbeddedEngine` (batched across concurrent episodes) serving `model`."""
    from envhub.agents.engine import EngineAgent
    from envhub.inference import SamplingParams
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine

    engine = EmbeddedEngine.from_pretrained(model, device=device)
    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=temperature)

    def make() -> Agent:
        return EngineAgent(engine, engine.tokenizer, sampling, max_total_tokens=max_total_tokens)

    return AgentFactory(
        spec, make, engine.close, {"model": model, "max_new_tokens": max_tokens, "temperature": temperature}
    )


def make_agent(spec: str, **options: Any) -> Agent:
    """One agent for `spec` (see `make_agent_factory` for the options)."""
    return make_agent_factory(spec, **options)()
