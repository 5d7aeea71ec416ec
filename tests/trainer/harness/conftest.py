"""Shared fixtures: a real gateway over the embedded engine with the tiny random Llama, and small envs."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest

from envhub import AgentEnv

pytest.importorskip("torch")


class AddEnv(AgentEnv):
    """One question (what is A + B?); the action is the answer, reward 1 when it is right."""

    system_prompt = "Answer with the number alone."

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        self.a, self.b = int(self.np_random.integers(10)), int(self.np_random.integers(10))
        return f"What is {self.a} + {self.b}?", info

    def step(self, action):
        right = action.strip() == str(self.a + self.b)
        return "Right." if right else "Wrong.", float(right), True, False, {"answer": self.a + self.b}


ANSWER_TOOL = {
    "type": "function",
    "function": {
        "name": "answer",
        "description": "Give your answer.",
        "parameters": {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]},
    },
}


class AddToolEnv(AddEnv):
    """AddEnv whose answer is a call of its `answer` tool."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return obs, {**info, "tools": [ANSWER_TOOL]}

    def step(self, action):
        if not isinstance(action, dict) or action.get("name") != "answer":
            return "Call the answer tool.", 0.0, False, False, {}
        return super().step(str(action["arguments"].get("value")))


@pytest.fixture(scope="session")
def tiny_policy(tokenizer):
    from envhub.trainer.models import tiny_llama

    return tiny_llama(tokenizer, seed=0)


@asynccontextmanager
async def running_gateway(model, tokenizer, **config):
    """A started gateway over an embedded engine serving `model`, with `GatewayConfig(**config)`; both stopped after."""
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.gateway import Gateway, GatewayConfig

    engine = EmbeddedEngine(model, tokenizer)
    gw = Gateway(engine, tokenizer, GatewayConfig(**config))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()
        await engine.close()


@pytest.fixture
async def gateway(tiny_policy, tokenizer):
    """A started gateway over the embedded engine (the untaught tiny model: harnesses here print their own
    actions, so what it says does not matter; that it is called and recorded does)."""
    async with running_gateway(tiny_policy, tokenizer, max_tokens_per_request=8, episode_token_budget=64) as gw:
        yield gw


@pytest.fixture
def recorded(monkeypatch):
    """What the engine generated (prompt ids -> [(output ids, logprobs)]) and what the learner trained
    ([(groups, stats)]), seen through the real `EmbeddedEngine.generate` and `Learner.step`."""
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.learner.step import Learner

    generated: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}
    trained: list[tuple[list, dict]] = []
    generate, step = EmbeddedEngine.generate, Learner.step

    async def recording_generate(self, input_ids, sampling):
        result = await generate(self, input_ids, sampling)
        generated.setdefault(tuple(input_ids), []).append((list(result.output_ids), list(result.logprobs)))
        return result

    def recording_step(self, groups, version=0):
        stats = step(self, groups, version)
        trained.append((groups, stats))
        return stats

    monkeypatch.setattr(EmbeddedEngine, "generate", recording_generate)
    monkeypatch.setattr(Learner, "step", recording_step)
    return generated, trained
