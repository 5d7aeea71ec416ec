"""The task mixture's sampler: fixed weights, and weights by each task's recent share of groups with signal."""

from collections import Counter

import pytest

from envhub.errors import ConfigError
from envhub.trainer.config import TaskConfig, config_from_dict
from envhub.trainer.rollout.tasks import TaskSampler


def mixture():
    return [TaskConfig(env="Math-v0", weight=1.0), TaskConfig(env="FrozenLake-v0", weight=1.0)]


def shares(sampler, draws=4000):
    counts = Counter(sampler.sample()[0].env for _ in range(draws))
    return {env: n / draws for env, n in counts.items()}


def test_fixed_weights_ignore_what_groups_gave():
    sampler = TaskSampler(mixture(), seed=0)
    for _ in range(20):
        sampler.observe(sampler.tasks[0], signal=False)
    assert sampler.weights() == [1.0, 1.0]
    assert abs(shares(sampler)["Math-v0"] - 0.5) < 0.03


def test_a_task_without_signal_is_drawn_at_its_floor_and_comes_back_with_signal():
    sampler = TaskSampler(mixture(), seed=0, by_signal=True, floor=0.1, memory=8)
    math, lake = sampler.tasks
    for _ in range(40):  # every Math group filtered (all rewards equal), every FrozenLake group trained
        sampler.observe(math, signal=False)
        sampler.observe(lake, signal=True)
    assert sampler.weights() == pytest.approx([0.1, 1.0])
    assert abs(shares(sampler)["Math-v0"] - 0.1 / 1.1) < 0.03
    for _ in range(40):  # Math starts to give signal again: its weight returns
        sampler.observe(math, signal=True)
    assert sampler.weights()[0] > 0.99


def test_half_the_groups_with_signal_halve_the_weight_and_the_state_round_trips():
    sampler = TaskSampler(mixture(), seed=3, by_signal=True, memory=4)
    math = sampler.tasks[0]
    for i in range(400):
        sampler.observe(math, signal=i % 2 == 0)
    assert 0.4 < sampler.weights()[0] < 0.65  # an average over ~4 groups of alternating outcomes
    restored = TaskSampler(mixture(), seed=99, by_signal=True, memory=4)
    restored.load_state(sampler.state())
    assert restored.weights() == sampler.weights()
    assert [restored.sample()[1] for _ in range(5)] == [sampler.sample()[1] for _ in range(5)]
    old = TaskSampler(mixture(), seed=3, by_signal=True)
    old.load_state(sampler.state()[:3])  # a checkpoint from before signal shares: the RNG alone
    assert old.weights() == [1.0, 1.0]


def test_signal_sampling_without_the_filter_is_refused():
    data = {"tasks": [{"env": "Math-v0"}], "rollout": {"task_sampling": "signal"}}
    data["algorithm"] = {"filter_zero_variance": False}
    with pytest.raises(ConfigError, match="filter_zero_variance is false") as caught:
        config_from_dict(data)
    assert "task_sampling: fixed" in caught.value.hint
    with pytest.raises(ConfigError, match="task_sampling"):
        config_from_dict({"tasks": [{"env": "Math-v0"}], "rollout": {"task_sampling": "adaptive"}})


async def test_a_run_with_signal_sampling_draws_less_of_a_task_whose_groups_are_all_filtered(tmp_path):
    """The tiny model never answers Math-v0 (its groups all 0: filtered); Letters-v0's rewards differ. The
    checkpoint keeps each task's signal share, and Math's fell below Letters'."""
    pytest.importorskip("envhub.trainer.engines.embedded.engine")
    from envhub.trainer.learner.checkpoint import latest_checkpoint
    from envhub.trainer.train import Trainer

    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Math-v0", "kwargs": {"kind": "arithmetic", "difficulty": 3}}, {"env": "Letters-v0"}],
            "rollout": {"group_size": 4, "max_new_tokens": 4, "max_turns": 1, "task_sampling": "signal"},
            "algorithm": {"mode": "sync", "groups_per_step": 2, "lr": 0.01},
            "budget": {"steps": 3, "checkpoint_every": 3},
            "out_dir": str(tmp_path),
        }
    )
    await Trainer(config).run()
    math_share, letters_share = latest_checkpoint(tmp_path).state["sampler"][3]
    # seen: 0.670 (three Math groups, each filtered: 0.875 ** 3) and 1.0
    assert math_share <= 0.875 and letters_share > math_share, (math_share, letters_share)
