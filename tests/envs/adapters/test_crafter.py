"""crafter-* ids: Crafter as text, reproducible from a seed in any process, BALROG's progress in info."""

import json
import os
import subprocess
import sys
import warnings

import pytest
from gymnasium.utils.env_checker import check_env

import envhub
from envhub.envs.adapters.crafter import ACTIONS

pytest.importorskip("crafter", reason="needs crafter (pip install 'envhub[crafter]')")
IDS = [s.id for s in envhub.list_envs(tag="crafter")]

EPISODE = """
import hashlib, json, sys
import envhub
env = envhub.make("crafter-v0")
obs, info = env.reset(seed=5)
digest = hashlib.sha256(obs.encode())
moves = ["move north", "do", "move east", "do", "move south", "move west", "do", "noop", "sleep", "place table"]
for i in range(400):
    obs, reward, terminated, truncated, info = env.step(moves[(i * 7) % len(moves)])
    digest.update(f"{obs}|{reward}".encode())
    if terminated or truncated:
        obs, info = env.reset(seed=6 + i)
print(json.dumps({"digest": digest.hexdigest(), "position": [int(x) for x in env.unwrapped.game._player.pos]}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("env_id", IDS)
def test_every_id_passes_check_env(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(envhub.make(env_id).unwrapped, skip_render_check=True)


@pytest.mark.slow  # three fresh interpreters, each building a world
def test_the_same_seed_and_actions_give_the_same_episode_in_every_process():
    """crafter 1.8.3 orders creatures by memory address when it despawns one; the env's order does not depend on it."""
    runs = []
    for hash_seed in ("1", "2", "3"):  # without the fix, one run in three or so diverges
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", EPISODE], capture_output=True, text=True, check=True, env=env)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1] == runs[2]


WORLD = """
import hashlib, sys
if sys.argv[1] == "python":
    sys.modules["numba"] = None  # opensimplex then runs its noise as plain Python
import envhub
import opensimplex.internals
env = envhub.make("crafter-v0")
obs, info = env.reset(seed=9)
world = env.unwrapped.game._world
objects = sorted((type(o).__name__, *map(int, o.pos)) for o in world.objects)
digest = hashlib.sha256(world._mat_map.tobytes() + repr(objects).encode()).hexdigest()
print(hasattr(opensimplex.internals._noise3, "py_func"), digest)
"""


def test_the_installed_noise_is_compiled_and_builds_the_worlds_plain_python_builds():
    """The crafter extra brings numba, which opensimplex compiles its noise with (a reset ~15x cheaper)."""
    runs = {}
    for noise in ("installed", "python"):
        out = subprocess.run([sys.executable, "-c", WORLD, noise], capture_output=True, text=True, check=True)
        runs[noise] = out.stdout.split()
    assert runs["installed"][0] == "True" and runs["python"][0] == "False"
    assert runs["installed"][1] == runs["python"][1]


def test_observation_actions_and_progress():
    env = envhub.make("crafter-balrog-v0")
    obs, info = env.reset(seed=3)
    assert "Status: health 9/9, food 9/9, drink 9/9, energy 9/9" in obs and "Achievements: 0/22" in obs
    assert info["legal_actions"] == list(ACTIONS) and all(a in info["system_prompt"] for a in ACTIONS)
    assert info["progress"] == 0.0 and env.spec.kwargs["length"] == 2000
    obs, reward, terminated, truncated, info = env.step("juggle")
    assert obs.startswith("Unknown action 'juggle'") and info["invalid_action"] and reward == 0.0
    total, unlocked = 0.0, []
    for step in range(300):  # walk and hit things until something is unlocked
        action = ["move west", "do", "do", "move north", "do", "do"][step % 6]
        obs, reward, terminated, truncated, info = env.step(
            f'<tool_call>{{"name": "act", "arguments": {{"action": "{action}"}}}}</tool_call>'
        )
        total += reward
        unlocked = info["achievements"]
        if terminated or truncated:
            break
    assert unlocked and info["progress"] == pytest.approx(100 * len(unlocked) / 22, abs=0.01)
    assert f"Achievements: {len(unlocked)}/22" in obs


def test_bad_settings_are_refused():
    with pytest.raises(envhub.ConfigError):
        envhub.make("crafter-v0", length=0)
    with pytest.raises(envhub.ConfigError):
        envhub.make("crafter-v0", area=(4, 4))


def test_no_expert_is_claimed():
    assert not hasattr(envhub.make("crafter-v0").unwrapped, "oracle_action")
