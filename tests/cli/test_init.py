"""`envhub init NAME`: the scaffold installs, passes its own tests and is evaluated with no edit."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import envhub
from envhub.cli.init import scaffold, scaffold_names

RUFF = Path(sys.executable).with_name("ruff")


def run(*argv, cwd, env=None):
    return subprocess.run([*map(str, argv)], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_the_scaffold_installs_passes_its_tests_and_evaluates(tmp_path):
    done = run(sys.executable, "-m", "envhub.cli.main", "init", "ScaffoldProbe", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    root = tmp_path / "ScaffoldProbe"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        "README.md",
        "pyproject.toml",
        "scaffold_probe_env/__init__.py",
        "scaffold_probe_env/env.py",
        "tests/test_env.py",
    ]
    assert "pip install -e ScaffoldProbe\n" in done.stdout
    # the generated code is clean under ruff's defaults (what a new project gets)
    assert run(RUFF, "check", "--isolated", root, cwd=tmp_path).returncode == 0
    assert run(RUFF, "format", "--isolated", "--check", root, cwd=tmp_path).returncode == 0
    # installed into a private directory on this test's PYTHONPATH, not into the suite's venv: other tests run
    # envhub at the same time, and a plugin appearing there would change what they print
    site = tmp_path / "site"
    installed = run(sys.executable, "-m", "pip", "-q", "install", "--no-deps", "--no-build-isolation", "--target", site,
                    root, cwd=tmp_path)  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    tests = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=root, env=env)
    assert tests.returncode == 0 and "4 passed" in tests.stdout, tests.stdout + tests.stderr
    # from another folder: found through the installed entry point, no --import
    evaluated = run(
        sys.executable, "-m", "envhub.cli.main", "eval", "ScaffoldProbe-v0", "--agent", "random", "-n", "3",
        "--quiet", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert evaluated.returncode == 0 and "ScaffoldProbe-v0" in evaluated.stdout, evaluated.stderr
    info = run(sys.executable, "-m", "envhub.cli.main", "info", "ScaffoldProbe-v0", cwd=tmp_path, env=env)
    assert "source:       envhub-scaffold-probe" in info.stdout and "guess(number)" in info.stdout
    gone = run(sys.executable, "-m", "envhub.cli.main", "info", "ScaffoldProbe-v0", cwd=tmp_path)
    assert gone.returncode == 2  # outside this test's path the suite's environment never saw it


def test_names_are_derived_for_every_use():
    names = scaffold_names("TreasureHunt")
    assert (names.env_id, names.module, names.class_name, names.dist) == (
        "TreasureHunt-v0",
        "treasure_hunt_env",
        "TreasureHunt",
        "envhub-treasure-hunt",
    )
    maze = scaffold_names("grid-maze")
    assert (maze.class_name, maze.module) == ("GridMaze", "grid_maze_env")
    assert scaffold_names("Math").module == "math_env"  # never a stdlib name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("2fast", "cannot name an env"),
        ("my env", "cannot name an env"),
        ("../evil", "cannot name an env"),
        ("", "cannot name an env"),
        ("Maze-v1", "without a version"),
        ("FrozenLake", "FrozenLake-v0 is already registered (by envhub)"),
        ("None", "clash with a Python name"),
        ("ToolEnv", "clash with a Python name"),
    ],
)
def test_bad_names_are_refused(tmp_path, name, message):
    with pytest.raises(envhub.ConfigError, match=None) as err:
        scaffold(name, tmp_path)
    assert message in str(err.value)
    assert not any(tmp_path.iterdir())  # nothing written


def test_an_existing_folder_or_module_is_not_overwritten(tmp_path, monkeypatch):
    (tmp_path / "Taken").mkdir()
    (tmp_path / "Taken" / "notes.txt").write_text("mine")
    with pytest.raises(envhub.ConfigError, match="already exists"):
        scaffold("Taken", tmp_path)
    assert (tmp_path / "Taken" / "notes.txt").read_text() == "mine"
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "shadowed_env.py").write_text("")
    with pytest.raises(envhub.ConfigError, match="'shadowed_env' is already importable"):
        scaffold("Shadowed", tmp_path / "out")
    assert scaffold("Fresh", tmp_path).name == "Fresh"  # an empty or missing folder is fine
