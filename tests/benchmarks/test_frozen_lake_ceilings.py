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
