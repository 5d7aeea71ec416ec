"""The demo plays bundled envs with their solvers and a random policy, and never fails as a whole."""

import json

import envhub
from envhub import AgentEnv
from envhub.cli.demo import bundled_env_ids, main, run_demo


class Countdown(AgentEnv):
    """An env with no solver: ends after three steps, reward 1 on the last."""

    def __init__(self, render_mode=None):
        self.left = 3

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        self.left = 3
        return "count down", info

    def step(self, action):
        self.left -= 1
        return str(self.left), float(self.left == 0), self.left == 0, False, {}


def test_main_prints_a_table_with_solver_and_random_rows(capsys, tmp_path):
    out_file = tmp_path / "demo.json"
    assert main(["--envs", "FrozenLake-v0", "Math-v0", "--episodes", "2", "--json", str(out_file)]) == 0
    table = capsys.readouterr().out
    assert "mean return" in table and "FrozenLake-v0  solver" in table and "Math-v0        random" in table
    rows = json.loads(out_file.read_text())
    solver = {r["env_id"]: r for r in rows if r["policy"] == "solver"}
    assert solver["FrozenLake-v0"]["mean_return"] == 1.0 and solver["Math-v0"]["mean_return"] == 1.0
    assert all(r["episodes"] == 2 and not r["error"] for r in rows)


def test_env_without_solver_reports_random_only_and_broken_ids_get_an_error_row():
    envhub.register("DemoCountdown-v0", Countdown)
    results = run_demo(["DemoCountdown-v0", "NoSuchEnv-v0"], episodes=2)
    assert [(r.env_id, r.policy) for r in results] == [("DemoCountdown-v0", "random"), ("NoSuchEnv-v0", "-")]
    assert results[0].mean_return == 1.0 and results[0].mean_steps == 3
    assert "unknown environment" in results[1].error


def test_bundled_ids_cover_the_games():
    assert {"Sokoban-v0", "FrozenLake-v0", "Wordle-v0", "Math-v0"} <= set(bundled_env_ids())
