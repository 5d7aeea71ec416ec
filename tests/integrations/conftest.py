"""Shared pieces for the trainer integrations: the SmolLM2 tokenizer (plain, and with a tool template)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from envhub.trainer.models import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(scope="session")
def tool_tokenizer():
    """The SmolLM2 tokenizer with TRL's Qwen2.5 chat template, which renders tool schemas and tool calls."""
    pytest.importorskip("trl")
    from envhub.integrations.trl import use_tool_template
    from envhub.trainer.models import load_tokenizer

    return use_tool_template(load_tokenizer("tiny"))


def runs(mask, ids, value):
    """The runs of `ids` whose mask is `value`, in order (e.g. the model's turns of a response)."""
    found, current = [], []
    for m, t in zip(mask, ids):
        if m == value:
            current.append(t)
        elif current:
            found, current = [*found, current], []
    return found + ([current] if current else [])
