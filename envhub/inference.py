"""The inference-engine contract shared by the embedded engine, SGLang servers and the rollout code."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (the subset of SGLang's `sampling_params` RL uses)."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_new_tokens: int = 0
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added logit) pairs

    def to_sglang(self) -> dict[str, Any]:
        """As SGLang's `sampling_params` JSON."""
        params: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
        }
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.stop:
            params["stop"] = list(self.stop)
        if self.seed is not None:
            params["sampling_seed"] = self.seed
        defaults = SamplingParams()
        for name in (
            "min_p",
            "repetition_penalty",
            "frequency_penalty",
            "presence_penalty",
            "min_new_tokens",
            "ignore_eos",
        ):
            if getattr(self, name) != getattr(defaults, name):
                params[name] = getattr(self, name)
        if self.logit_bias:
            params["logit_bias"] = {str(token): bias for token, bias in self.logit_bias}
        return params


@dataclass(frozen=True)
class GenerateResult:
    """Output of one generation: token ids, their behaviour logprobs, why it ended, and by which policy."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    token_versions: list[int] = field(default_factory=list)  # policy version that sampled each output token


class InferenceEngine(abc.ABC):
    """Serves a policy: generation with per-token logprobs, in-place weight updates, pause/resume."""

    @abc.abstractmethod
    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        """Continue `input_ids`; returns the new tokens with their logprobs under the serving policy."""

    @abc.abstractmethod
    async def update_weights(self, path_or_state: Any, version: int | None = None) -> None:
        """Load new policy weights (a checkpoint directory or a state dict) and bump the version."""

    async def pause(self) -> None:
        """Stop admitting generation work (in-flight requests may be aborted and resubmitted)."""

    async def resume(self) -> None:
        """Admit generation work again."""

    @abc.abstractmethod
    async def health(self) -> bool:
        """True when the engine can serve requests."""

    def raise_if_failed(self) -> None:
        """Raise the engine's fatal error, if it has one (e.g. a server process it manages has exited), so a
        caller waiting on rollouts stops with it instead of waiting for generations that can never come."""

    async def close(self) -> None:
        """Release the engine's resources."""
