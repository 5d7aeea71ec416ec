"""Shared fixtures for engine tests: the SmolLM2 tokenizer and tiny random Llama models over it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def tokenizer():
    from envhub.trainer.models import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture
def tiny_model(tokenizer):
    """A fresh model per test: weight-update tests write into it."""
    from envhub.trainer.models import tiny_llama

    return tiny_llama(tokenizer, seed=0)


@pytest.fixture
async def engine(tiny_model, tokenizer):
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine

    eng = EmbeddedEngine(tiny_model, tokenizer)
    yield eng
    await eng.close()


def _greedy_reference(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain transformers greedy decoding of one unpadded prompt."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


def _recomputed_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of `output` under one forward pass over prompt + output."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


@pytest.fixture(scope="session")
def greedy_reference():
    return _greedy_reference


@pytest.fixture(scope="session")
def recomputed_logprobs():
    return _recomputed_logprobs
