"""Shared fixtures: the SmolLM2 tokenizer, tiny random Llama policies over it, small real envs, the vLLM server."""

from __future__ import annotations

import re

import pytest

import envhub
from envhub import AgentEnv


class GuessNumber(AgentEnv):
    """Guess a secret digit (from the seed) in a few turns; the env answers higher/lower."""

    system_prompt = "Guess the secret digit. Answer with one digit."

    def __init__(self, turns: int = 3):
        self.turns = turns

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        self.secret = int(self.np_random.integers(10))
        self.tries = 0
        return "I am thinking of a digit from 0 to 9.", {**info, "secret": self.secret}

    def step(self, action):
        self.tries += 1
        digits = re.findall(r"\d", action)
        if not digits:
            return "No digit found, try again.", 0.0, False, self.tries >= self.turns, {}
        guess = int(digits[0])
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        hint = "higher" if guess < self.secret else "lower"
        return f"{guess} is wrong, go {hint}.", 0.0, False, self.tries >= self.turns, {}


envhub.register("GuessNumberTest-v0", GuessNumber, tags=("test",))


@pytest.fixture(scope="session")
def tokenizer():
    models = pytest.importorskip("envhub.trainer.models")
    return models.load_tokenizer("tiny")


@pytest.fixture
def tiny_model(tokenizer):
    from envhub.trainer.models import tiny_llama

    return tiny_llama(tokenizer, seed=0)


@pytest.fixture(scope="session")  # one start per run, shared by every test that needs vLLM (xdist_group "vllm")
def vllm_servers():
    """Two real vLLM servers (`serve-engine --backend vllm --model tiny`, API key TINY_KEY) on 127.0.0.1, started
    side by side: the first is every vLLM test's (`vllm_url`), the second only the several-engine run's, which
    stops it (starting it with the first costs ~20 s of the suite, alone ~55 s)."""
    from tests.vllm_support import TINY_KEY, serve_engines_vllm

    with serve_engines_vllm(2, "--model", "tiny", "--rl-routes", "--kv-cache-gib", "1", "--api-key", TINY_KEY) as both:
        yield both


@pytest.fixture(scope="session")
def vllm_url(vllm_servers):
    """The real vLLM server every vLLM test shares (tiny, API key TINY_KEY)."""
    return vllm_servers[0].url


@pytest.fixture
def engine_cls():
    return pytest.importorskip("envhub.trainer.engines.embedded.engine").EmbeddedEngine
