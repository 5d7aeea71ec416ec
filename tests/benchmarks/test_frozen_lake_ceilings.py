"""benchmarks/frozen_lake_ceilings.py: scripted FrozenLake policies played in the real env, counted by hand."""

import importlib.util
import json
from pathlib import Path

import pytest

import envhub

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("frozen_lake_ceilings", ROOT / "benchmarks" / "frozen_lake_ceilings.py")
ceilings = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ceilings)


def holes_on(grid, moves):
    """Whether walking `moves` from the top-left corner steps on a hole before the goal (by hand, no env)."""
    r = c = 0
    for move in moves:
        r, c = (r + 1, c) if move == "down" else (r, c + 1)
        if grid[r][c] == "H":
            return True
    return False


def test_rates_match_a_count_by_hand_and_reading_beats_every_replay(tmp_path):
    report = ceilings.main(["--maps", "60", "--first-seed", "500", "--out", str(tmp_path / "c.json")])
    assert json.loads((tmp_path / "c.json").read_text()) == report
    success = report["success"]
    lake = envhub.make("FrozenLake-v0", size=3)
    grids = []
    for seed in range(500, 560):
        lake.reset(seed=seed)
        grids.append(lake.unwrapped.grid)
    by_hand = sum(not holes_on(g, ["down", "right", "right", "down"]) for g in grids) / 60
    assert success["replay d r r d"] == pytest.approx(by_hand)
    assert len([k for k in success if k.startswith("replay ")]) == 6  # C(4, 2) routes without detours
    assert success["solver (shortest path)"] == 1.0  # every 3x3 map has a 4-move route
    assert report["best_replay"]["success"] == max(v for k, v in success.items() if k.startswith("replay "))
    assert report["reading_one_square_gains"] > 0.15
    assert 0.0 < report["best_replay"]["success"] < success["down if safe, else right"] < 1.0


def test_the_turn_limit_is_applied_and_bad_settings_are_refused():
    tight = ceilings.ceilings(maps=30, max_turns=3)  # 3 moves never cross a 3x3 lake
    assert set(tight["success"].values()) == {0.0}
    with pytest.raises(SystemExit, match="maps >= 1"):
        ceilings.ceilings(maps=0)


def test_random_ends_try_every_four_move_replay_and_count_them_by_hand():
    report = ceilings.ceilings(hole_fraction=0.4, max_turns=6, maps=40, first_seed=700, random_ends=True)
    success = report["success"]
    assert report["settings"]["random_ends"] is True
    assert len([k for k in success if k.startswith("replay ")]) == 4**4
    lake = envhub.make("FrozenLake-v0", size=3, hole_fraction=0.4, random_ends=True).unwrapped
    steps = {"u": (-1, 0), "d": (1, 0), "l": (0, -1), "r": (0, 1)}
    won = 0
    for seed in range(700, 740):  # "replay u l r r", walked by hand on each map (the edge keeps the player)
        lake.reset(seed=seed)
        (r, c), grid = lake.start, lake.grid
        for turn in range(6):
            dr, dc = steps["ulrr"[turn % 4]]
            if 0 <= r + dr < 3 and 0 <= c + dc < 3:
                r, c = r + dr, c + dc
            if grid[r][c] in "HG":
                won += grid[r][c] == "G"
                break
    assert success["replay u l r r"] == pytest.approx(won / 40)
    assert (
        report["best_replay"]["success"] < success["a safe move toward the goal"] <= success["solver (shortest path)"]
    )
    assert "down if safe, else right" not in success  # a corner-to-corner rule means nothing when the ends move
