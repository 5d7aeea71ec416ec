"""README's baseline tables, regenerated: `envhub eval` once per set, each summary.json kept in one place.

    python benchmarks/eval_baselines.py [--sets random,expert,...] [--out benchmarks/results/eval-baselines]

Each set is one `envhub eval` command run as a user would (a subprocess, fixed seeds, `--quiet`); its summary.json
is copied to `OUT/<set>.json` and the README rows (mean total reward ± standard error, success rate as pass@1,
BALROG's progress for the suites) are printed. Success is the env's own (`info["success"]`, progress 100, or the
threshold its spec documents), so an expert that always finishes a MiniGrid level scores pass@1 1.0 although its
reward is below 1. The SmolLM2 sets are smoke figures (a few seeds, short turns) and take the longest: the model
decodes on the CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GAMES = ["ConnectFour-v0", "KuhnPoker-v0", "TicTacToe-v0"]
SINGLE = ["FrozenLake-v0", "Letters-v0", "Math-v0", "Sokoban-v0", "WebShop-v0", "Wordle-v0"]
SUITES = [
    "minigrid-BabyAI-GoToLocal-v0",
    "minigrid-MiniGrid-DoorKey-5x5-v0",
    "textworld-simple-v0",
    "textworld-coin_collector-v0",
    "sciworld-find-living-thing-v0",
    "crafter-balrog-v0",
]
SUITES_SMOLLM2 = [
    "minigrid-BabyAI-GoToLocal-v0",
    "textworld-simple-v0",
    "sciworld-find-living-thing-v0",
    "crafter-balrog-v0",
]
SMOKE = ["--max-tokens", "64", "--max-turns", "8"]  # SmolLM2: a smoke figure, not a benchmark
VS_RANDOM = ["--opponent", "random"]  # multi-agent games, seat by seat

SETS: dict[str, list[str]] = {
    "random": [*SINGLE, *GAMES, "--agent", "random", "-n", "100", *VS_RANDOM],
    "expert": [*SINGLE, *GAMES, "--agent", "expert", "-n", "100", *VS_RANDOM],
    "swe-random": ["SWE-v0", "--agent", "random", "-n", "10"],
    "swe-expert": ["SWE-v0", "--agent", "expert", "-n", "10"],
    "ta-random": ["ta-TicTacToe-v0", "ta-ConnectFour-v0", "--agent", "random", "-n", "20", *VS_RANDOM],
    "suites-random": [*SUITES, "--agent", "random", "-n", "20", "--seed", "1000", "--max-turns", "2000"],
    "suites-expert": [*SUITES, "--agent", "expert", "-n", "20", "--seed", "1000", "--max-turns", "2000"],
    "smollm2": [*SINGLE, "SWE-v0", *GAMES, "--agent", "smollm2", "-n", "5", *SMOKE, *VS_RANDOM],
    "suites-smollm2": [*SUITES_SMOLLM2, "--agent", "smollm2", "-n", "3", "--seed", "1000", *SMOKE],
}


def run_set(name: str, out: Path) -> dict:
    """Runs one set's `envhub eval` in a fresh directory and keeps its summary as OUT/<name>.json."""
    with tempfile.TemporaryDirectory(prefix=f"envhub-baseline-{name}-") as scratch:
        command = [sys.executable, "-m", "envhub.cli.main", "eval", *SETS[name], "--quiet", "--out", scratch]
        started = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: `{' '.join(command[2:])}` failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        summary = json.loads((Path(scratch) / "summary.json").read_text())
        shutil.copy(Path(scratch) / "summary.json", out / f"{name}.json")
    print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return summary


def cell(entry: dict) -> str:
    """`mean ± se (pass@1)`, with BALROG's progress where the env reports it."""
    if not entry.get("episodes"):
        return "no expert" if "no_expert" in entry.get("errors", {}) else "–"
    text = f"{entry['mean_reward']:.2f} ± {entry['stderr']:.2f}"
    success = (entry.get("pass_at_k") or {}).get("1")
    if success is not None:
        text += f", {success:.2f}"
    if "progress" in entry:
        text += f" ({entry['progress']['mean']:.0f} ± {entry['progress']['stderr']:.0f})"
    return text


TABLES = {  # README's tables: the sets side by side, one row per env (seat)
    "games and tasks": ("random", "expert", "smollm2"),
    "agent suites": ("suites-random", "suites-expert", "suites-smollm2"),
}
FOLDED = {"swe-random": "random", "swe-expert": "expert"}  # SWE-v0's Docker runs, shown in the main table


def readme_rows(folder: Path, table: str) -> list[str]:
    """The README rows of `table` from the summaries in `folder`: `| env | set 1 | set 2 | set 3 |`."""
    columns = TABLES[table]
    summaries = {name: json.loads((folder / f"{name}.json").read_text()) for name in columns}
    for extra, into in FOLDED.items():
        if into in columns and (folder / f"{extra}.json").exists():
            summaries[into] = {**summaries[into], **json.loads((folder / f"{extra}.json").read_text())}
    envs = sorted({env for summary in summaries.values() for env in summary}, key=lambda e: ("#" in e, e))
    return [f"| `{env}` | " + " | ".join(cell(summaries[n].get(env, {})) for n in columns) + " |" for env in envs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of: {', '.join(SETS)}")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/eval-baselines"))
    parser.add_argument("--readme", action="store_true", help="print README's tables from OUT's summaries, run none")
    args = parser.parse_args()
    if args.readme:
        for table in TABLES:
            print(f"{table}:", *readme_rows(Path(args.out), table), sep="\n")
        return
    names = [n.strip() for n in args.sets.split(",") if n.strip()]
    unknown = [n for n in names if n not in SETS]
    if unknown:
        parser.error(f"unknown set(s) {', '.join(unknown)}: choose from {', '.join(SETS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        summary = run_set(name, out)
        print(f"## {name}")
        for env, entry in sorted(summary.items()):
            print(f"| `{env}` | {cell(entry)} |")


if __name__ == "__main__":
    main()
