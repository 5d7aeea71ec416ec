"""Sokoban: solvable generated levels, the exact solver, pushes, invalid moves and shaping."""

import pytest

import envhub
from envhub.envs.sokoban import SokobanEnv


def play(env, moves):
    total, result = 0.0, None
    for move in moves:
        result = env.step(move)
        total += result[1]
    return total, result


def test_solver_solves_20_seeds_with_return_one():
    env = envhub.make("Sokoban-v0")
    for seed in range(20):
        _, info = env.reset(seed=seed)
        plan = env.unwrapped.solve()
        assert len(plan) == info["optimal_length"] >= env.unwrapped.min_solution_length
        total, (obs, _, terminated, truncated, info) = play(env, plan)
        assert total == 1.0 and terminated and not truncated
        assert info["success"] and info["boxes_on_target"] == 2 and "level solved" in obs


@pytest.mark.parametrize("kwargs", [{"dim": 8, "num_boxes": 3}, {"dim": (6, 9), "num_boxes": 1, "scramble_steps": 80}])
def test_difficulty_knobs_shape_the_level(kwargs):
    env = SokobanEnv(**kwargs)
    obs, info = env.reset(seed=4)
    grid = obs.splitlines()[1 : 1 + env.height]
    assert len(grid) == env.height and all(len(row) == env.width for row in grid)
    assert sum(row.count("$") + row.count("*") for row in grid) == env.num_boxes
    assert sum(row.count(".") + row.count("*") + row.count("+") for row in grid) == env.num_boxes
    total, _ = play(env, env.solve())
    assert total == 1.0


def test_moves_change_the_state_and_walls_block():
    env = SokobanEnv()
    env.reset(seed=0)
    move = env.solve()[0]
    obs, reward, terminated, _, info = env.step(move)
    assert obs.startswith("You moved " + move) and not info["invalid_action"] and reward == 0.0
    offsets = {"up": -env.width, "down": env.width, "left": -1, "right": 1}
    blocked = [
        (seed, d)
        for seed in range(30)
        if env.reset(seed=seed)
        for d, o in offsets.items()
        if env.state[0] + o in env.walls
    ]
    seed, direction = blocked[0]
    env.reset(seed=seed)
    state = env.state
    obs, reward, terminated, _, info = env.step(f"I will go {direction}")
    assert "a wall is in the way" in obs and info["invalid_action"] and reward == 0.0 and not terminated
    assert env.state == state


def test_box_cannot_be_pushed_into_a_wall_and_deadlocks_have_no_solution():
    env = SokobanEnv(dim=5, num_boxes=1, min_solution_length=1)
    env.reset(seed=0)
    # a hand-made 5x5 room: floor is the 3x3 interior; box at (1,2) against the top wall
    w = env.width
    env.walls = frozenset(c for c in range(25) if not (1 <= c // w <= 3 and 1 <= c % w <= 3))
    env.targets = frozenset({3 * w + 3})
    env.state = (2 * w + 2, frozenset({1 * w + 2}))
    obs, reward, *_, info = env.step("up")
    assert "cannot push the box up: a wall is behind it" in obs and info["invalid_action"]
    assert env.solve() is None  # a box on the top wall, target below: never solvable
    env.state = (2 * w + 1, frozenset({2 * w + 2}))
    assert env.solve() == ["right", "up", "right", "down"]


def test_shaped_rewards_for_pushing_onto_and_off_targets():
    env = SokobanEnv(dim=5, num_boxes=2, shaped=True, min_solution_length=1)
    env.reset(seed=0)
    w = env.width
    env.walls = frozenset(c for c in range(25) if not (1 <= c // w <= 3 and 1 <= c % w <= 3))
    env.targets = frozenset({1 * w + 3, 3 * w + 3})
    env.state = (1 * w + 1, frozenset({1 * w + 2, 3 * w + 2}))
    _, reward, terminated, _, info = env.step("right")  # box onto the target at (1,3)
    assert reward == pytest.approx(0.1) and not terminated and info["boxes_on_target"] == 1
    unshaped = SokobanEnv(dim=5, num_boxes=2, min_solution_length=1)
    unshaped.reset(seed=0)
    unshaped.walls, unshaped.targets, unshaped.state = (
        env.walls,
        env.targets,
        (1 * w + 1, frozenset({1 * w + 2, 3 * w + 2})),
    )
    assert unshaped.step("right")[1] == 0.0


def test_tool_call_and_last_direction_word_wins():
    a, b = SokobanEnv(), SokobanEnv()
    a.reset(seed=5)
    b.reset(seed=5)
    move = a.solve()[0]
    other = "up" if move != "up" else "down"
    obs_a = a.step(f'<tool_call>{{"name": "move", "arguments": {{"direction": "{move}"}}}}</tool_call>')[0]
    obs_b = b.step(f"First I thought {other}, but no: {move.upper()}")[0]
    assert obs_a == obs_b and obs_a.startswith(f"You moved {move}")


def test_render_has_a_legend_and_step_after_solving_needs_reset():
    env = SokobanEnv()
    env.reset(seed=2)
    assert "Legend: # wall" in env.render_text() and "Boxes on targets: " in env.render_text()
    play(env, env.solve())
    with pytest.raises(envhub.ResetNeeded):
        env.step("up")


def free_both_sides(seeds=range(60)):
    """A level whose player has floor without a box both left and right of it."""
    env = SokobanEnv()
    for seed in seeds:
        env.reset(seed=seed)
        player, boxes = env.state
        if all(cell not in env.walls and cell not in boxes for cell in (player - 1, player + 1)):
            return seed
    raise AssertionError("no level with free squares left and right of the player")


def test_anchor_names_the_state_not_the_path_to_it():
    seed = free_both_sides()
    env = SokobanEnv()
    start = env.reset(seed=seed)[1]["anchor"]
    assert env.step("left")[4]["anchor"] != start  # another square, another state
    back_from_left = env.step("right")[4]["anchor"]
    env.reset(seed=seed)
    env.step("right")
    back_from_right = env.step("left")[4]["anchor"]
    assert back_from_left == back_from_right == start
    row, col = divmod(env.state[0], env.width)
    assert f"player={row},{col}|boxes=" in start


def test_anchor_changes_with_a_push_and_the_map_but_not_with_an_invalid_move():
    env = SokobanEnv()
    assert len({env.reset(seed=seed)[1]["anchor"].split("|")[0] for seed in range(5)}) == 5  # five maps, five digests
    offsets = {"up": -env.width, "down": env.width, "left": -1, "right": 1}
    seed, direction = next(
        (seed, d)
        for seed in range(30)
        if env.reset(seed=seed)
        for d, o in offsets.items()
        if env.state[0] + o in env.walls
    )
    start = env.reset(seed=seed)[1]["anchor"]
    for action in (direction, "no direction at all"):
        *_, info = env.step(action)
        assert info["invalid_action"] and info["anchor"] == start
    boxes = env.state[1]
    for move in env.solve():
        *_, info = env.step(move)
        if env.state[1] != boxes:  # the first push moves a box, and the anchor says so
            assert info["anchor"].split("|boxes=")[1] != start.split("|boxes=")[1]
            break
    else:
        raise AssertionError("the solution pushed no box")
