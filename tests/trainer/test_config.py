"""YAML configs: defaults, nested tasks, and errors that name the bad key and the fix."""

from pathlib import Path

import pytest

from envhub.errors import ConfigError
from envhub.trainer.config import config_from_dict, load_config
from envhub.trainer.staleness import Staleness


def test_minimal_config_gets_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("tasks:\n  - env: Math-v0\n    weight: 2\n    kwargs: {difficulty: 1}\nalgorithm: {lr: 0.001}\n")
    config = load_config(path)
    assert (
        config.tasks[0].env == "Math-v0"
        and config.tasks[0].weight == 2.0
        and config.tasks[0].kwargs == {"difficulty": 1}
    )
    assert config.algorithm.lr == 0.001 and config.algorithm.clip_high == 0.28 and config.rollout.group_size == 4


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": {"max_stalenes": 2}})
    assert "algorithm.max_stalenes" in str(err.value) and "max_staleness" in str(err.value)
    with pytest.raises(ConfigError, match="tasks\\[0\\].wieght"):
        config_from_dict({"tasks": [{"env": "Math-v0", "wieght": 1}]})


def test_a_fractional_staleness_bound_is_accepted_unless_it_rounds_to_sync():
    half = {"max_staleness": 0.5, "groups_per_step": 4}
    config = config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": half})
    assert config.algorithm.max_staleness == 0.5
    with pytest.raises(ConfigError) as err:
        config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": {"max_staleness": 0.1, "groups_per_step": 4}})
    assert "rounds down to 0 groups" in str(err.value) and "0.25 (one group of the 4" in str(err.value)
    # in sync mode the bound is not used, so it is not checked
    config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": {"mode": "sync", "max_staleness": 0.1}})


def test_spare_groups_are_checked_and_reach_the_staleness_rule():
    with pytest.raises(ConfigError, match="spare_groups must be >= 0, got -1"):
        config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": {"mode": "sync", "spare_groups": -1}})
    spares = config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": {"mode": "sync", "spare_groups": 2}})
    assert Staleness.from_config(spares.algorithm) == Staleness(0, "drop", 2)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"tasks": []}, "no tasks"),
        ({"tasks": [{"env": "Math-v0"}], "algorithm": {"mode": "fast"}}, "one of async, sync"),
        ({"tasks": [{"env": "Math-v0"}], "rollout": {"group_size": "four"}}, "integer"),
        ({"tasks": [{"env": "Math-v0"}], "rollout": {"group_size": 1}}, "at least 2"),
        ({"tasks": "Math-v0"}, "must be a list"),
    ],
)
def test_bad_values_are_clear_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_exponent_numbers_without_a_dot_are_numbers(tmp_path):
    # PyYAML (YAML 1.1) reads `1e-5` as the string "1e-5"; a learning rate written that way must still work
    path = tmp_path / "c.yaml"
    path.write_text("tasks: [{env: Letters-v0}]\nalgorithm: {lr: 1e-5, groups_per_step: 2e0}\nsft: {lr: +3E-4}\n")
    config = load_config(path)
    assert config.algorithm.lr == pytest.approx(1e-5) and config.sft.lr == pytest.approx(3e-4)
    assert config.algorithm.groups_per_step == 2 and isinstance(config.algorithm.groups_per_step, int)
    with pytest.raises(ConfigError, match="must be a number"):
        config_from_dict({"tasks": [{"env": "Letters-v0"}], "algorithm": {"lr": "fast"}})


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_shipped_config_loads(path):
    config = load_config(path)
    assert config.tasks and config.budget.steps > 0


def test_ci_tiny_trains_16_steps_with_a_decaying_lr_and_a_greedy_held_out_evaluation():
    config = load_config(Path(__file__).resolve().parents[2] / "configs" / "ci-tiny.yaml")
    assert config.budget.steps == 16 and config.algorithm.mode == "sync"
    assert config.evaluation.episodes > 0 and config.evaluation.temperature == 0.0  # eval.json, greedy
    assert config.algorithm.lr_schedule == "cosine"  # at a constant lr the policy collapses before step 16


def harness_task(harness, **top):
    return {"tasks": [{"env": "Letters-v0", "harness": harness}], **top}


@pytest.mark.parametrize(
    "data, message",
    [
        (harness_task(""), r"tasks\[0\].harness is empty .*name a built-in harness \(openai-agents, mini-swe-agent\)"),
        (harness_task("   "), r"tasks\[0\].harness is empty"),
        (harness_task("openai-agent"), r"'openai-agent' is not a built-in harness .*did you mean 'openai-agents'"),
        (harness_task("mini-swe-agnet"), r"not a built-in harness .*did you mean 'mini-swe-agent'"),
        (harness_task("openai-agents", rollout={"group_size": 1}), "group_size must be at least 2"),
        (harness_task("openai-agents", algorithm={"advantage": "gigpo"}), "harness episode has one reward.*grpo"),
        (harness_task("openai-agents", sft={"collect": 4}), "sft.collect records the env's own expert turns"),
        (harness_task("openai-agents", evaluation={"episodes": 4}), "envhub eval ENV --agent hf:DIR --harness H"),
        (harness_task(["python3", "agent.py"]), r"tasks\[0\].harness must be a string"),
        (
            {"tasks": [{"env": "Letters-v0", "harness_env": {"A": "1"}}]},
            "sets harness_env or harness_errors but has no",
        ),
        ({"tasks": [{"env": "Letters-v0", "harness": "openai-agents", "harness_errors": "keep"}]}, "one of drop, zero"),
    ],
)
def test_bad_harness_tasks_are_one_line_errors(data, message):
    with pytest.raises(ConfigError, match=message) as err:
        config_from_dict(data)
    assert "\n" not in str(err.value)


def test_a_harness_is_a_built_in_name_or_any_command_line():
    for harness in ("openai-agents", "python3 agent.py", "./agent.sh", "/opt/agent/run"):
        config = config_from_dict(harness_task(harness))
        assert config.tasks[0].harness == harness and config.tasks[0].harness_env == {}
    assert config_from_dict({"tasks": [{"env": "Letters-v0"}]}).tasks[0].harness is None
