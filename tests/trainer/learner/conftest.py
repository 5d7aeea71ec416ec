"""Groups of trajectories whose behaviour logprobs come from a real tiny Llama (what an engine would report)."""

from __future__ import annotations

import random

import pytest
import torch

from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.learner.step import sequence_logprobs
from envhub.trainer.trajectory import Trajectory


def make_groups(model, n_groups=2, group_size=4, lengths=(12, 40), temperature=1.0, seed=0, version=0, rewards=None):
    """GRPO groups of random prompt + reply tokens; behaviour logprobs from `model` at `temperature`."""
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    groups = []
    for g in range(n_groups):
        group = []
        for i in range(group_size):
            length = rng.randint(*lengths)
            prompt = rng.randint(3, max(3, length // 3))
            ids = [rng.randrange(vocab) for _ in range(length)]
            mask = [0] * prompt + [1] * (length - prompt)
            with torch.no_grad():
                lp = sequence_logprobs(
                    model,
                    torch.tensor([ids]),
                    torch.ones(1, length, dtype=torch.long),
                    temperature,
                    torch.tensor([mask], dtype=torch.float32),
                )[0].tolist()
            reward = rewards[i] if rewards is not None else float((i + g) % 2)
            group.append(
                Trajectory(
                    input_ids=ids,
                    loss_mask=mask,
                    behavior_logprobs=lp,
                    versions=[-1] * prompt + [version] * (length - prompt),
                    reward=reward,
                    task="t",
                    group_id=f"g{g}",
                    seed=g,
                    turns=1,
                    finish_reason="terminated",
                )
            )
        groups.append(group)
    return groups


def algo(**overrides) -> AlgorithmConfig:
    """An AlgorithmConfig with test-friendly defaults."""
    return AlgorithmConfig(**{"lr": 1e-3, "max_initial_kl": 0.05, **overrides})


@pytest.fixture
def groups(tiny_model):
    return make_groups(tiny_model)
