"""The CLI as a new env author meets it: `info` shows kwargs and reward, `play` errors are one line, pipes echo, the
demo fails loudly."""

import io
import subprocess
import sys

import pytest

import envhub
from envhub.cli.demo import main as demo_main
from envhub.cli.main import main
from envhub.cli.play import play
from envhub.envinfo import constructor_kwargs


@pytest.mark.parametrize("env_id", [s.id for s in envhub.list_envs() if s.source == "envhub"])
def test_info_lists_every_kwarg_with_type_and_default_and_the_reward(env_id, capsys):
    assert main(["info", env_id]) == 0
    out = capsys.readouterr().out
    kwargs, _ = constructor_kwargs(envhub.spec(env_id).load())
    lines = out.splitlines()
    for k in kwargs:
        assert any(line.startswith(f"  {k.describe()}") for line in lines), (k, out)
    reward = next(line for line in lines if line.startswith("reward:"))
    assert "documents none" not in reward and len(reward) > 20, out


def test_info_shows_types_defaults_and_registered_values(capsys):
    main(["info", "Sokoban-v0"])
    out = capsys.readouterr().out
    assert "  dim: int | tuple[int, int] = (7, 7)\n" in out and "  shaped: bool = False\n" in out
    main(["info", "TicTacToe-SelfPlay-v0"])
    assert "  opponent: str | OpponentPolicy = 'random'   (registered: \"random\")" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (
            "{bad",
            "envhub: error: --kwargs is not valid JSON (Expecting property name enclosed in double quotes at column "
            "2): {bad",
        ),
        ("[1, 2]", "envhub: error: --kwargs must be a JSON object, got list"),
        ('{"slipery": true}', "envhub: error: FrozenLake-v0: unknown kwarg 'slipery'; did you mean 'slippery'?"),
        (
            '{"size": 1}',
            'envhub: error: cannot build FrozenLake-v0 with kwargs {"size": 1}: FrozenLake size must be at least 2, '
            'got 1',
        ),
    ],
)
def test_play_kwargs_errors_are_one_line_and_exit_non_zero(kwargs, expected, capsys):
    assert main(["play", "FrozenLake-v0", "--kwargs", kwargs]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == expected and len(err) == 2 and err[1].startswith("hint: ")


def test_play_from_a_pipe_echoes_each_action():
    out = io.StringIO()
    play("FrozenLake-v0", seed=1, stdin=io.StringIO("right\nnot a move\n"), stdout=out)
    text = out.getvalue()
    assert "> right\n\nYou tried to go right" in text and "> not a move\n\nNo move found" in text


def test_play_through_a_real_pipe_echoes_and_bad_kwargs_print_no_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", "play", "FrozenLake-v0", "--seed", "1"],
        input="right\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "> right" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", "play", "Sokoban-v0", "--kwargs", '{"dim": "big"}'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines()[0].endswith("Sokoban dim must be an integer or a [height, width] pair, got 'big'")


def test_demo_exits_non_zero_when_a_row_fails(capsys):
    assert demo_main(["--envs", "FrozenLake-v0", "NoSuchEnv-v0", "--episodes", "1"]) == 1
    assert "1 of 3 rows failed: NoSuchEnv-v0" in capsys.readouterr().out
    done = subprocess.run(
        [sys.executable, "-m", "envhub.cli.demo", "--envs", "NoSuchEnv-v0", "--episodes", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1


class NeedsLevel(envhub.AgentEnv):
    """An env with a required kwarg."""

    def __init__(self, level: int, hard: bool = False) -> None:
        self.level = level

    def step(self, action):
        return "", 0.0, True, False, {}


def test_info_of_an_env_with_a_required_kwarg_lists_it_and_fails_in_one_line(capsys):
    envhub.register("NeedsLevel-v0", NeedsLevel)
    assert main(["info", "NeedsLevel-v0"]) == 2
    captured = capsys.readouterr()
    assert "  level: int\n  hard: bool = False\n" in captured.out
    assert (
        captured.err.startswith("envhub: error: cannot build NeedsLevel-v0 without kwargs")
        and "Traceback" not in captured.err
    )
    assert main(["play", "NeedsLevel-v0", "--kwargs", '{"levl": 2}']) == 2
    assert "unknown kwarg 'levl'; did you mean 'level'?" in capsys.readouterr().err
