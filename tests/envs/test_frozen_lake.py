"""FrozenLake: maps with a path, the BFS solver, slippery dynamics and the value-iteration policy."""

from collections import Counter

import pytest

import envhub
from envhub.envs.frozen_lake import FrozenLakeEnv


@pytest.mark.parametrize("size", [4, 8])
def test_shortest_path_solver_reaches_the_goal_on_20_seeds(size):
    env = envhub.make("FrozenLake-v0", size=size, hole_fraction=0.3)
    for seed in range(20):
        env.reset(seed=seed)
        plan = env.unwrapped.solve()
        assert len(plan) >= 2 * (size - 1)  # Manhattan distance from corner to corner
        total = 0.0
        for move in plan:
            obs, reward, terminated, truncated, info = env.step(move)
            total += reward
        assert total == 1.0 and terminated and info["success"] and "reached the goal" in obs


def test_maps_have_holes_and_always_a_path():
    env = FrozenLakeEnv(size=6, hole_fraction=0.5)
    holes = 0
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        holes += sum(row.count("H") for row in env.grid)
        assert env.grid[0][0] == "S" and env.grid[-1][-1] == "G" and env.solve() is not None
    assert holes > 50  # about half of the 34 free squares per map
    assert obs.splitlines()[1].startswith("P")


def test_falling_into_a_hole_ends_with_zero_and_edges_stop_you():
    env = FrozenLakeEnv(size=4, hole_fraction=0.0)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("up")
    assert "bumped into the edge" in obs and info["position"] == (0, 0) and not terminated
    env.grid = ["SHFF", "FFFF", "FFFF", "FFFG"]
    obs, reward, terminated, _, info = env.step(
        '<tool_call>{"name": "move", "arguments": {"direction": "right"}}</tool_call>'
    )
    assert reward == 0.0 and terminated and info["fell"] and "fell into a hole" in obs


def test_slippery_moves_go_each_allowed_way_a_third_of_the_time():
    env = FrozenLakeEnv(size=5, hole_fraction=0.0, slippery=True)
    env.reset(seed=0)
    outcomes = Counter()
    for _ in range(900):
        env.position = (2, 2)
        env.step("up")
        outcomes[env.position] += 1
    assert set(outcomes) == {(1, 2), (2, 1), (2, 3)}  # never backwards
    assert all(240 <= n <= 360 for n in outcomes.values()), outcomes


def test_value_iteration_policy_matches_its_success_probability():
    env = FrozenLakeEnv(size=4, hole_fraction=0.2, slippery=True)
    env.reset(seed=1)
    predicted = env.success_probability()
    assert 0.0 < predicted < 1.0
    wins, episodes = 0.0, 400
    for _ in range(episodes):
        env.position, env.done = (0, 0), False
        for _ in range(300):
            _, reward, terminated, _, _ = env.step(env.oracle_action())
            if terminated:
                break
        wins += reward
    assert abs(wins / episodes - predicted) < 0.08


def test_non_slippery_policy_is_certain_and_follows_shortest_paths():
    env = FrozenLakeEnv(size=5, hole_fraction=0.25)
    env.reset(seed=3)
    assert env.success_probability() == pytest.approx(1.0)
    shortest, steps, reward = len(env.solve()), 0, 0.0
    while not env.done:
        reward = env.step(env.optimal_policy()[env.position])[1]
        steps += 1
    assert reward == 1.0 and steps == shortest


def test_impossible_hole_fraction_fails_with_a_hint_instead_of_looping():
    env = FrozenLakeEnv(size=8, hole_fraction=0.99)
    with pytest.raises(RuntimeError, match="lower hole_fraction"):
        env.reset(seed=0)


def test_spaced_grid_gives_every_cell_its_own_token():
    from envhub.trainer.models import load_tokenizer

    tokenizer = load_tokenizer("tiny")  # the SmolLM2 tokenizer
    compact, spaced = FrozenLakeEnv(size=3), FrozenLakeEnv(size=3, spaced=True)
    obs_compact, _ = compact.reset(seed=5)
    obs_spaced, _ = spaced.reset(seed=5)
    assert spaced.grid == compact.grid == ["SFF", "HFH", "FFG"]  # same map, drawn differently
    assert obs_spaced.splitlines()[1:4] == ["P F F", "H F H", "F F G"]
    assert obs_compact.splitlines()[1:4] == ["PFF", "HFH", "FFG"]
    for row in obs_spaced.splitlines()[1:4]:
        pieces = [tokenizer.decode([t]).strip() for t in tokenizer.encode(row, add_special_tokens=False)]
        assert pieces == row.split(), pieces
    merged = [tokenizer.decode([t]) for t in tokenizer.encode("PFF", add_special_tokens=False)]
    assert len(merged) < 3  # why spaced exists: compact rows merge cells into one token
    obs, *_ = spaced.step("right")
    assert obs.splitlines()[-3:-2] == ["F F G"] and "S P F" in obs


def test_neighbours_line_names_the_four_squares_around_the_player_and_changes_nothing_else():
    plain, described = FrozenLakeEnv(size=3, spaced=True), FrozenLakeEnv(size=3, spaced=True, neighbours=True)
    obs_plain, info_plain = plain.reset(seed=5)
    obs, info = described.reset(seed=5)
    assert described.grid == ["SFF", "HFH", "FFG"]
    assert obs == obs_plain + "\nNext to you: up the edge, down a hole, left the edge, right ice."
    assert info["anchor"] == info_plain["anchor"]  # the same state, described more
    obs, *_ = described.step("right")
    assert obs.endswith("Next to you: up the edge, down ice, left the start, right ice.")
    obs, *_ = described.step("down")
    assert obs.endswith("Next to you: up ice, down ice, left a hole, right a hole.")


def test_anchor_names_the_square_whatever_the_way_there():
    env = FrozenLakeEnv(size=4, hole_fraction=0.0)
    start = env.reset(seed=0)[1]["anchor"]
    env.step("right")
    via_right = env.step("down")[4]["anchor"]
    env.reset(seed=0)
    env.step("down")
    via_down = env.step("right")[4]["anchor"]
    assert via_right == via_down != start and via_right.endswith("|pos=1,1")
    assert env.step("down")[4]["anchor"] != via_down  # another square, another anchor


def test_anchor_stays_when_nothing_moves_and_differs_between_maps():
    env = FrozenLakeEnv(size=4, hole_fraction=0.0)
    start = env.reset(seed=0)[1]["anchor"]
    *_, info = env.step("no move in this reply")
    assert info["invalid_action"] and info["anchor"] == start
    assert env.step("up")[4]["anchor"] == start  # bumped into the edge: the same square
    holes = FrozenLakeEnv(size=4, hole_fraction=0.3)
    maps = {}
    for seed in range(6):
        _, info = holes.reset(seed=seed)
        maps.setdefault(tuple(holes.grid), set()).add(info["anchor"])
    assert len(maps) > 1 and all(len(anchors) == 1 for anchors in maps.values())
    assert len(set().union(*maps.values())) == len(maps)  # same square (the start), different maps: different anchors
    slippery = FrozenLakeEnv(size=4, hole_fraction=0.0, slippery=True)
    assert slippery.reset(seed=0)[1]["anchor"] != start  # the same map on ice moves differently


def test_random_ends_draw_start_and_goal_apart_and_the_status_line_names_the_goal():
    env = FrozenLakeEnv(size=3, hole_fraction=0.4, spaced=True, random_ends=True)
    pairs = set()
    for seed in range(200):
        obs, info = env.reset(seed=seed)
        (sr, sc), (gr, gc) = env.start, env.goal
        assert abs(sr - gr) + abs(sc - gc) >= 2  # size - 1 moves apart at least
        assert env.grid[sr][sc] == "S" and env.grid[gr][gc] == "G"
        assert sum(row.count("S") for row in env.grid) == sum(row.count("G") for row in env.grid) == 1
        assert info["position"] == (sr, sc) and f"pos={sr},{sc}" in info["anchor"]
        assert f"You are at row {sr}, column {sc} (0-based), on the start. The goal is at row {gr}, column {gc}." in obs
        pairs.add((env.start, env.goal))
        plan = env.solve()
        assert plan  # a path exists, and walking it wins
        for move in plan:
            obs, reward, terminated, *_ = env.step(move)
        assert terminated and reward == 1.0
    assert len(pairs) > 20  # the ends vary (48 ordered pairs qualify on a 3x3 lake)
    fixed = FrozenLakeEnv(size=3, hole_fraction=0.4, spaced=True)
    obs, _ = fixed.reset(seed=3)
    assert fixed.start == (0, 0) and fixed.goal == (2, 2) and "The goal is at" not in obs
