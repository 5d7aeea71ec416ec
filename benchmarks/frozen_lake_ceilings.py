"""What reading the FrozenLake map is worth: held-out success of scripted policies that do not read it, that read one
square ahead, and of the solver, on the maps a trained policy is evaluated on.

    python benchmarks/frozen_lake_ceilings.py [--size 3] [--hole-fraction 0.2] [--max-turns 4] [--maps 2000]
        [--random-ends] [--first-seed 1000000] [--out benchmarks/results/frozen_lake_ceilings.json]

A policy that replays one move sequence on every map (what SmolLM2-135M does greedily after the demo's SFT) wins
where that sequence happens to miss the holes; `down` when the square below is no hole, else `right`, wins more;
the shortest-path solver wins every map it can reach within the turn limit. Each policy plays the real env
(`envhub.make("FrozenLake-v0")`) through its text actions, on the held-out seeds `first_seed ..` (the trainer's
evaluation seeds by default).

With `--random-ends` (the env's `random_ends=True`: start and goal drawn anew for each map) no corner-to-corner route
exists to replay, so every move sequence of length min(max_turns, 4), repeated, is tried (256 of them); reading one
square ahead becomes "a safe move toward the goal, else any safe move".
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import envhub
from envhub.envs.directions import DIRECTIONS

Policy = Callable[[Any, int], str]  # (the unwrapped env, turn) -> a direction


def play(env: Any, seed: int, policy: Policy, max_turns: int) -> float:
    """One episode of `policy` on the map of `seed`: its reward (1.0 on reaching the goal within max_turns)."""
    env.reset(seed=seed)
    lake = env.unwrapped
    total = 0.0
    for turn in range(max_turns):
        _, reward, terminated, truncated, _ = env.step(policy(lake, turn))
        total += float(reward)
        if terminated or truncated:
            break
    return total


def replay(moves: tuple[str, ...]) -> Policy:
    """The same move sequence on every map, whatever it shows."""
    return lambda lake, turn: moves[turn % len(moves)]


def look_one_ahead(first: str, second: str) -> Policy:
    """`first` when that square is on the lake and no hole, else `second`."""

    def policy(lake: Any, turn: int) -> str:
        (r, c), (dr, dc) = lake.position, DIRECTIONS[first]
        on_lake = 0 <= r + dr < lake.size and 0 <= c + dc < lake.size
        return first if on_lake and lake.grid[r + dr][c + dc] != "H" else second

    return policy


def toward_goal(lake: Any, turn: int) -> str:
    """A move that brings the goal closer onto a square that is no hole, else any move onto ice, else down."""
    (r, c), (gr, gc) = lake.position, lake.goal
    safe = []
    for name, (dr, dc) in DIRECTIONS.items():
        nr, nc = r + dr, c + dc
        if 0 <= nr < lake.size and 0 <= nc < lake.size and lake.grid[nr][nc] != "H":
            closer = abs(nr - gr) + abs(nc - gc) < abs(r - gr) + abs(c - gc)
            safe.append((not closer, name))
    return min(safe)[1] if safe else "down"


def solver(lake: Any, turn: int) -> str:
    return lake.oracle_action()


def ceilings(
    size: int = 3,
    hole_fraction: float = 0.2,
    max_turns: int = 4,
    maps: int = 2000,
    first_seed: int = 1_000_000,
    random_ends: bool = False,
) -> dict[str, Any]:
    """Success rate of each scripted policy over `maps` held-out maps."""
    if maps < 1 or size < 2 or max_turns < 1:
        raise SystemExit(f"need maps >= 1, size >= 2 and max_turns >= 1 (got {maps}, {size}, {max_turns})")
    env = envhub.make("FrozenLake-v0", size=size, hole_fraction=hole_fraction, random_ends=random_ends)
    if random_ends:
        sequences = list(itertools.product(sorted(DIRECTIONS), repeat=min(max_turns, 4)))
    else:
        shortest = ("down",) * (size - 1) + ("right",) * (size - 1)
        sequences = sorted(set(itertools.permutations(shortest)))  # every corner-to-corner route without detours
    policies: dict[str, Policy] = {"replay " + " ".join(m[0] for m in seq): replay(seq) for seq in sequences}
    if random_ends:
        policies["a safe move toward the goal"] = toward_goal
    else:
        policies["down if safe, else right"] = look_one_ahead("down", "right")
        policies["right if safe, else down"] = look_one_ahead("right", "down")
    policies["solver (shortest path)"] = solver
    seeds = range(first_seed, first_seed + maps)
    success = {name: sum(play(env, s, policy, max_turns) for s in seeds) / maps for name, policy in policies.items()}
    replays = {k: v for k, v in success.items() if k.startswith("replay ")}
    best_replay = max(replays, key=replays.__getitem__)
    return {
        "settings": {
            "size": size,
            "hole_fraction": hole_fraction,
            "max_turns": max_turns,
            "maps": maps,
            "first_seed": first_seed,
            "random_ends": random_ends,
        },
        "success": success,
        "best_replay": {"policy": best_replay, "success": replays[best_replay]},
        "reading_one_square_gains": max(
            v for k, v in success.items() if k not in replays and not k.startswith("solver")
        )
        - replays[best_replay],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=3)
    parser.add_argument("--hole-fraction", type=float, default=0.2)
    parser.add_argument("--max-turns", type=int, default=4, help="the rollout's max_turns (configs/demo.yaml: 4)")
    parser.add_argument("--maps", type=int, default=2000)
    parser.add_argument("--first-seed", type=int, default=1_000_000, help="the trainer's first held-out seed")
    parser.add_argument("--random-ends", action="store_true", help="start and goal drawn anew for each map")
    parser.add_argument("--out", default="benchmarks/results/frozen_lake_ceilings.json")
    args = parser.parse_args(argv)
    report = ceilings(args.size, args.hole_fraction, args.max_turns, args.maps, args.first_seed, args.random_ends)
    for name, rate in sorted(report["success"].items(), key=lambda item: -item[1])[:12]:
        print(f"{rate:6.3f}  {name}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
