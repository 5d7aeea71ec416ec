"""Steps/s of envhub's own envs vs their adapted equivalents (TextArena, GEM, reasoning-gym, OpenEnv), in one run.

    python benchmarks/adapters.py [--seconds 2] [--rounds 3] [--out benchmarks/results/adapters.json] [--only PAIR]

Each pair is timed in alternating rounds (ours, theirs, ours, ...) so that machine load hits both
alike; resets count as time, not steps. Each env gets valid moves in its own format (`up`,
`[up]`, `\\boxed{up}`). Prints a table and writes JSON with the ratio ours/theirs per pair. The agent suites
(MiniGrid/BabyAI, TextWorld, ScienceWorld, Crafter) have no envhub twin: "Agent suites" gives their own steps/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import envhub

MOVES = ["up", "left", "down", "right"]
# (pair, our env, adapted envs); each env: (label, factory, action format)
PAIRS: list[tuple[str, list[tuple[str, Callable[[], Any], Callable[[int], str]]]]] = [
    (
        "Sokoban",
        [
            ("Sokoban-v0", lambda: envhub.make("Sokoban-v0"), lambda i: MOVES[i % 4]),
            ("ta-Sokoban-raw-v0", lambda: envhub.make("ta-Sokoban-raw-v0"), lambda i: f"[{MOVES[i % 4]}]"),
            (
                "gem-game-Sokoban-easy-v0",
                lambda: envhub.make("gem-game-Sokoban-easy-v0"),
                lambda i: f"\\boxed{{{MOVES[i % 4]}}}",
            ),
        ],
    ),
    (
        "FrozenLake",
        [
            ("FrozenLake-v0", lambda: envhub.make("FrozenLake-v0"), lambda i: MOVES[i % 4]),
            ("ta-FrozenLake-raw-v0", lambda: envhub.make("ta-FrozenLake-raw-v0"), lambda i: f"[{MOVES[i % 4]}]"),
        ],
    ),
    (
        "Math vs basic_arithmetic",
        [
            ("Math-v0", lambda: envhub.make("Math-v0"), lambda i: f"\\boxed{{{i}}}"),
            (
                "rg-basic_arithmetic-v0",
                lambda: envhub.make("rg-basic_arithmetic-v0"),
                lambda i: f"<answer>{i}</answer>",
            ),
            (
                "gem-rg-basic_arithmetic-v0",
                lambda: envhub.make("gem-rg-basic_arithmetic-v0"),
                lambda i: f"\\boxed{{{i}}}",
            ),
        ],
    ),
    (
        "TicTacToe self-play",
        [
            (
                "TicTacToe-SelfPlay-v0",
                lambda: envhub.make("TicTacToe-SelfPlay-v0"),
                lambda i: "ABC"[i % 3] + "123"[(i // 3) % 3],
            ),
            ("SelfPlay(ta-TicTacToe-raw-v0)", lambda: envhub.SelfPlay("ta-TicTacToe-raw-v0"), lambda i: f"[{i % 9}]"),
        ],
    ),
]
CRAFTER_MOVES = ["move north", "move east", "do", "move south", "move west", "do"]
# The agent suites have no envhub twin: their own steps/s (valid commands; resets inside the window count as time)
SUITES: list[tuple[str, Callable[[], Any], Callable[[int], str]]] = [
    (
        "minigrid-BabyAI-GoToLocal-v0",
        lambda: envhub.make("minigrid-BabyAI-GoToLocal-v0"),
        lambda i: ("turn left", "go forward", "turn right", "go forward")[i % 4],
    ),
    ("textworld-simple-v0", lambda: envhub.make("textworld-simple-v0"), lambda i: ("look", "inventory")[i % 2]),
    ("sciworld-find-living-thing-v0", lambda: envhub.make("sciworld-find-living-thing-v0"), lambda i: "look around"),
    ("crafter-balrog-v0", lambda: envhub.make("crafter-balrog-v0"), lambda i: CRAFTER_MOVES[i % 6]),
]
SKIPPED = {
    "Wordle": "TextArena's and GEM's Wordle download NLTK's word list at run time; envhub refuses downloads "
    "(docs/adapters.md)"
}


def steps_per_second(factory: Callable[[], Any], action: Callable[[int], str], seconds: float) -> dict[str, float]:
    """Steps/s of one env for `seconds` (resets inside the window count as time)."""
    env = factory()
    steps, episodes, seed = 0, 0, 0
    started = time.perf_counter()
    env.reset(seed=seed)
    while time.perf_counter() - started < seconds:
        _, _, terminated, truncated, _ = env.step(action(steps))
        steps += 1
        if terminated or truncated:
            episodes += 1
            seed += 1
            env.reset(seed=seed)
    elapsed = time.perf_counter() - started
    env.close()
    return {"steps": steps, "episodes": episodes, "seconds": elapsed}


def suite_steps_per_second(
    factory: Callable[[], Any], action: Callable[[int], str], seconds: float, rounds: int
) -> dict[str, float]:
    """Steps/s of one suite env after a warm-up reset outside the window: the one-time costs (the JVM's start,
    a TextWorld game's generation, then cached) are not what a long run pays per step; later resets count."""
    warm = factory()
    warm.reset(seed=0)
    warm.close()
    totals = {"steps": 0, "episodes": 0, "seconds": 0.0}
    for _ in range(rounds):
        for key, value in steps_per_second(factory, action, seconds).items():
            totals[key] += value
    return {**totals, "steps_per_s": round(totals["steps"] / totals["seconds"], 1)}


def openenv_pair(seconds: float, rounds: int) -> dict[str, Any]:
    """Sokoban-v0 in process vs the same env behind `envhub serve --protocol openenv` driven by OpenEnvEnv."""
    from aiohttp import web

    from envhub.server.guard import ServerLimits
    from envhub.server.openenv_server import OpenEnvServer

    loop = asyncio.new_event_loop()
    unlimited = ServerLimits(rate_limit=0)  # the protocol's cost, not the default 500 messages/s per client
    runner = web.AppRunner(OpenEnvServer("Sokoban-v0", limits=unlimited).app())

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    threading.Thread(target=loop.run_forever, daemon=True).start()
    port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        envs = [
            ("Sokoban-v0", lambda: envhub.make("Sokoban-v0"), lambda i: MOVES[i % 4]),
            (
                "OpenEnvEnv(envhub serve --protocol openenv)",
                lambda: envhub.OpenEnvEnv(f"http://127.0.0.1:{port}"),
                lambda i: MOVES[i % 4],
            ),
        ]
        return measure(envs, seconds, rounds)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)


def measure(
    envs: list[tuple[str, Callable[[], Any], Callable[[int], str]]], seconds: float, rounds: int
) -> dict[str, Any]:
    """Alternate the envs for `rounds` rounds; steps/s per env and ratio of the first to each other."""
    totals = {label: {"steps": 0, "episodes": 0, "seconds": 0.0} for label, _, _ in envs}
    for _ in range(rounds):
        for label, factory, action in envs:
            for key, value in steps_per_second(factory, action, seconds).items():
                totals[label][key] += value
    rates = {label: t["steps"] / t["seconds"] for label, t in totals.items()}
    ours = envs[0][0]
    return {
        "envs": {label: {**totals[label], "steps_per_s": round(rates[label], 1)} for label in totals},
        "ratio_ours_over_theirs": {label: round(rates[ours] / rates[label], 2) for label in rates if label != ours},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per env per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/adapters.json")
    parser.add_argument(
        "--only", action="append", default=None, help="measure only this pair (repeat); others stay as in --out"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    wanted = (lambda name: name in args.only) if args.only else (lambda name: True)
    old = json.loads(Path(args.out).read_text()) if args.only and Path(args.out).exists() else {}
    results: dict[str, Any] = dict(old.get("pairs", {}))
    for pair, envs in PAIRS:
        if wanted(pair):
            results[pair] = measure(envs, args.seconds, args.rounds)
    if wanted("Sokoban over OpenEnv's protocol"):
        results["Sokoban over OpenEnv's protocol"] = openenv_pair(args.seconds, args.rounds)
    if wanted("Agent suites"):
        alone = {label: suite_steps_per_second(f, a, max(args.seconds, 10.0), args.rounds) for label, f, a in SUITES}
        results["Agent suites"] = {"envs": alone, "ratio_ours_over_theirs": {}}
    print(f"{'pair':<32} {'env':<46} {'steps/s':>10} {'ours/theirs':>12}")
    for pair, row in results.items():
        for label, env in row["envs"].items():
            ratio = row["ratio_ours_over_theirs"].get(label)
            print(f"{pair:<32} {label:<46} {env['steps_per_s']:>10.1f} {'' if ratio is None else f'{ratio:.2f}x':>12}")
    for pair, why in SKIPPED.items():
        print(f"{pair:<32} skipped: {why}")
    report = {
        "benchmark": "adapters",
        "seconds_per_env_per_round": args.seconds,
        "rounds": args.rounds,
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "load_average_1min_at_end": round(os.getloadavg()[0], 1),  # other jobs on the machine depress the rates
        },
        "pairs": results,
        "skipped": SKIPPED,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
