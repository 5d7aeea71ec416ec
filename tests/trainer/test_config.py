"""YAML configs: defaults, nested tasks, and errors that name the bad key and the fix."""

import pytest

from envhub.errors import ConfigError
from envhub.trainer.config import config_from_dict, load_config


def test_minimal_config_gets_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("tasks:\n  - env: Math-v0\n    weight: 2\n    kwargs: {difficulty: 1}\nalgorithm: {lr: 0.001}\n")
    config = load_config(path)
    assert config.tasks[0].env == "Math-v0" and config.tasks[0].weight == 2.0 and config.tasks[0].kwargs == {"difficulty": 1}
    assert config.algorithm.lr == 0.001 and config.algorithm.clip_high == 0.28 and config.rollout.group_size == 4


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"tasks": [{"env": "Math-v0"}], "algorithm": {"max_stalenes": 2}})
    assert "algorithm.max_stalenes" in str(err.value) and "max_staleness" in str(err.value)
    with pytest.raises(ConfigError, match="tasks\\[0\\].wieght"):
        config_from_dict({"tasks": [{"env": "Math-v0", "wieght": 1}]})


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
