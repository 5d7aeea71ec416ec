"""Third-party packages add envs through the `envhub.envs` entry-point group: a real pip install.

The packages go into a folder of this test's own (`pip install --target`) that only its subprocesses have on their
path: installed into the shared virtualenv, the broken one would warn in every other test's subprocess meanwhile.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

GOOD = "envhub-plugin-demo-good"
BROKEN = "envhub-plugin-demo-broken"


def _write_package(root, dist_name, module, body):
    pkg = root / dist_name
    (pkg / module).mkdir(parents=True)
    (pkg / module / "__init__.py").write_text(textwrap.dedent(body))
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "{dist_name}"
            version = "0.0.1"
            [project.entry-points."envhub.envs"]
            {module} = "{module}:register_envs"
            [tool.setuptools]
            packages = ["{module}"]
            """
        )
    )
    return pkg


def _pip(*args):
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True, capture_output=True, text=True)


def _run(argv, site):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def _python(code, site):
    return _run([sys.executable, "-c", textwrap.dedent(code)], site)


@pytest.fixture(scope="module")
def installed_plugins(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins")
    good = _write_package(
        root,
        GOOD,
        "countdown_env",
        """
        import envhub

        class Countdown(envhub.AgentEnv):
            \"\"\"Say 'next' until the counter reaches zero.\"\"\"

            def __init__(self, start=3):
                self.start = start

            def reset(self, *, seed=None, options=None):
                _, info = super().reset(seed=seed)
                self.left = self.start
                return f"{self.left} left", info

            def step(self, action):
                self.left -= 1
                return f"{self.left} left", float(self.left == 0), self.left == 0, False, {}

        def register_envs():
            envhub.register("Countdown-v0", Countdown, tags=("plugin",), description="A plugin env.")
        """,
    )
    broken = _write_package(root, BROKEN, "broken_env", "def register_envs():\n    raise RuntimeError('boom')\n")
    site = root / "site"
    _pip("install", "--no-deps", "--no-build-isolation", "--target", str(site), str(good), str(broken))
    return site


def test_plugin_env_is_listed_and_works_with_gym_make(installed_plugins):
    listing = _run([sys.executable, "-m", "envhub.cli.main", "list", "--tag", "plugin"], installed_plugins)
    assert listing.returncode == 0
    assert "Countdown-v0" in listing.stdout and GOOD in listing.stdout  # the source package is named
    run = _python(
        """
        import envhub, gymnasium as gym
        env = gym.make("envhub/Countdown-v0", start=2)
        env.reset(seed=0)
        print(env.step("next")[0], env.step("next")[1])
        """,
        installed_plugins,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "left", "1.0"]


def test_broken_plugin_warns_with_its_package_name_and_builtins_still_work(installed_plugins):
    run = _python(
        """
        import warnings
        warnings.simplefilter("always")
        import envhub
        ids = {s.id for s in envhub.list_envs()}
        print("FrozenLake-v0" in ids, "Sokoban-v0" in ids, "Countdown-v0" in ids)
        """,
        installed_plugins,
    )
    assert run.returncode == 0, run.stderr
    assert BROKEN in run.stderr and "boom" in run.stderr and "Built-in envs are unaffected" in run.stderr
    assert run.stdout.split() == ["True", "True", "True"]
