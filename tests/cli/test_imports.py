"""`--import MODULE_OR_FILE` on every command that takes an env id, and its errors (envhub.user_modules)."""

import json
import subprocess
import sys
import textwrap

import pytest

import envhub
from envhub.cli.main import build_parser
from envhub.trainer.config import load_config
from envhub.user_modules import load_user_module

# A plugin-style module: it registers in register_envs(), which envhub calls after importing it. It imports a
# neighbour file, which works because the file's folder goes on the path (as with `python FILE`).
SHOUT = '''
import envhub
from shout_words import LOUD


class Shout(envhub.AgentEnv):
    """Say anything: the env shouts it back. Reward: 1.0 for a reply, one turn."""

    def oracle_action(self):
        return "hello"

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        return "say something", info

    def step(self, action):
        return LOUD(str(action)), 1.0, True, False, {}


def register_envs():
    envhub.register("{id}", Shout, max_episode_steps=1)
'''


def write_shout(folder, env_id, name="shout_env"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shout_words.py").write_text("LOUD = str.upper\n")
    path = folder / f"{name}.py"
    path.write_text(SHOUT.replace("{id}", env_id))
    return path


def run_cli(*args, cwd, stdin=""):
    return subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_command_that_takes_an_env_id_has_the_option():
    commands = build_parser()._subparsers._group_actions[0].choices
    for name in ("eval", "play", "info", "train", "collect", "serve", "list"):
        options = {o for a in commands[name]._actions for o in a.option_strings}
        assert "--import" in options, name


def test_a_file_works_with_info_play_eval_collect_and_list(tmp_path):
    write_shout(tmp_path / "mine", "ShoutFile-v0")
    target = "mine/shout_env.py"
    info = run_cli("info", "ShoutFile-v0", "--import", target, cwd=tmp_path)
    assert info.returncode == 0 and "id:           ShoutFile-v0" in info.stdout, info.stderr
    played = run_cli("play", "ShoutFile-v0", "--import", target, cwd=tmp_path, stdin="hi there\n")
    assert played.returncode == 0 and "HI THERE" in played.stdout, played.stderr
    evaluated = run_cli(
        "eval", "ShoutFile-v0", "--agent", "random", "-n", "2", "--quiet", "--import", target, cwd=tmp_path
    )
    assert evaluated.returncode == 0 and "ShoutFile-v0" in evaluated.stdout, evaluated.stderr
    out = tmp_path / "demos.jsonl"
    collected = run_cli("collect", "ShoutFile-v0", "-n", "2", "--out", str(out), "--import", target, cwd=tmp_path)
    assert collected.returncode == 0, collected.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["messages"][-1]["content"] for r in rows] == ["hello", "hello"]
    listed = run_cli("list", "--import", str(tmp_path / target), cwd="/")  # an absolute path from anywhere
    assert listed.returncode == 0 and "ShoutFile-v0" in listed.stdout


def test_a_module_name_is_found_in_the_working_directory(tmp_path):
    write_shout(tmp_path, "ShoutModule-v0", name="shout_module")
    done = run_cli("info", "ShoutModule-v0", "--import", "shout_module", cwd=tmp_path)
    assert done.returncode == 0 and "ShoutModule-v0" in done.stdout, done.stderr
    without = run_cli("info", "ShoutModule-v0", cwd=tmp_path)
    assert without.returncode == 2 and "--import MODULE_OR_FILE" in without.stderr  # the hint says how


def test_a_module_that_registers_nothing_is_reported(tmp_path):
    (tmp_path / "quiet.py").write_text("X = 1\n")
    done = run_cli("info", "Quiet-v0", "--import", "quiet.py", cwd=tmp_path)
    assert done.returncode == 2
    assert "warning: --import quiet.py registered no env" in done.stderr
    assert "unknown environment 'Quiet-v0'" in done.stderr


@pytest.mark.parametrize(
    ("files", "target", "message"),
    [
        ({}, "no_such_module_xyz", "no module named 'no_such_module_xyz'"),
        ({}, "./missing.py", "no such file"),
        ({"data.json": "{}"}, "./data.json", "not a Python file"),
        ({"broken.py": "x = 1\nraise ValueError('bad setting')\n"}, "broken.py", "ValueError: bad setting (at "),
        ({"typo.py": "def f(:\n"}, "./typo.py", "SyntaxError"),
        ({"needs.py": "import not_installed_dep_xyz\n"}, "needs", "No module named 'not_installed_dep_xyz'"),
        ({"reg.py": "def register_envs():\n    raise RuntimeError('nope')\n"}, "reg.py", "register_envs() raised"),
        ({}, "  ", "empty name"),
    ],
)
def test_bad_imports_are_one_line_with_a_hint(tmp_path, files, target, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    done = run_cli("info", "Shout-v0", "--import", target, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"envhub: error: --import {target.strip()}") and message in lines[0], done.stderr
    assert lines[1].startswith("hint: ") and len(lines) == 2


def test_the_error_points_at_the_line_that_raised(tmp_path):
    (tmp_path / "oops.py").write_text("import os\n\nVALUE = int('not a number')\n")
    with pytest.raises(envhub.ConfigError) as err:
        load_user_module(str(tmp_path / "oops.py"))
    assert f"(at {tmp_path / 'oops.py'}:3)" in str(err.value)
    assert "oops" not in sys.modules  # a failed import leaves nothing half-loaded behind


def test_a_file_named_like_an_imported_module_is_refused(tmp_path):
    (tmp_path / "json.py").write_text("X = 1\n")
    with pytest.raises(envhub.ConfigError, match="a different module named 'json' is already imported") as err:
        load_user_module(str(tmp_path / "json.py"))
    assert "rename json.py" in err.value.hint
    assert not hasattr(sys.modules["json"], "X")


def test_loading_twice_imports_once(tmp_path):
    path = tmp_path / "counted_env.py"
    path.write_text("import builtins\nbuiltins.counted_env_loads = getattr(builtins, 'counted_env_loads', 0) + 1\n")
    first = load_user_module(str(path))
    assert load_user_module(str(path)) is first and load_user_module("counted_env") is first
    import builtins

    assert builtins.counted_env_loads == 1


def test_train_config_imports_are_relative_to_the_config_file(tmp_path):
    write_shout(tmp_path / "cfg", "ShoutTrain-v0")
    config = tmp_path / "cfg" / "run.yaml"
    config.write_text("imports: [shout_env.py, json]\ntasks: [{env: ShoutTrain-v0}]\n")
    assert load_config(config).imports == [str(tmp_path / "cfg" / "shout_env.py"), "json"]
    (tmp_path / "cfg" / "bad.yaml").write_text("imports: shout_env.py\ntasks: [{env: ShoutTrain-v0}]\n")
    with pytest.raises(envhub.ConfigError, match="imports must be a list"):
        load_config(tmp_path / "cfg" / "bad.yaml")


@pytest.mark.slow
def test_train_with_an_imported_env_runs(tmp_path):
    write_shout(tmp_path / "envs", "ShoutTrainRun-v0")
    config = tmp_path / "run.yaml"
    config.write_text(
        textwrap.dedent(
            """
            model: {name: tiny}
            tasks: [{env: ShoutTrainRun-v0}]
            rollout: {group_size: 2, max_turns: 1, max_new_tokens: 4}
            algorithm: {groups_per_step: 1, filter_zero_variance: false, mode: sync}
            budget: {steps: 1}
            out_dir: run
            """
        )
    )
    done = run_cli("train", str(config), "--import", "envs/shout_env.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["imports"] == [str(tmp_path / "envs" / "shout_env.py")]  # what Ray workers would import too
