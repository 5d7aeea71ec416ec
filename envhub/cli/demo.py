"""`python -m envhub.cli.demo`: play seeded episodes of every bundled single-agent env and print a table.

Each env is played by its scripted solver (when it has an `oracle_action()` method) and by a random
policy that writes random tool calls from the env's own tool schemas, so the table shows both the
best return an env allows and what chance gets. An env that cannot be built or fails mid-episode
gets a row saying so; the demo always finishes, and exits non-zero when any row failed.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

RANDOM_WORDS = (
    "up",
    "down",
    "left",
    "right",
    "crane",
    "house",
    "plant",
    "ghost",
    "maybe",
    "hello",
    "answer",
    "the",
    "box",
)
MAX_STEPS = 200  # a backstop for envs registered without max_episode_steps


@dataclass(frozen=True)
class DemoResult:
    """One row of the table: an env played by one policy for some episodes."""

    env_id: str
    policy: str
    episodes: int
    mean_return: float
    mean_steps: float
    seconds: float
    error: str = ""


Policy = Callable[[Any, dict[str, Any]], "str | None"]


def oracle_policy(env: Any, info: dict[str, Any]) -> str | None:
    """The env's scripted solver or oracle."""
    return env.unwrapped.oracle_action()


def make_random_policy(seed: int) -> Policy:
    """A policy that calls a random tool with random arguments (enum values, words, numbers), or babbles."""
    rng = random.Random(seed)

    def value(schema: dict[str, Any]) -> Any:
        if "enum" in schema:
            return rng.choice(schema["enum"])
        if schema.get("type") in ("integer", "number"):
            return rng.randint(0, 100)
        return rng.choice((*RANDOM_WORDS, str(rng.randint(0, 100))))

    def act(env: Any, info: dict[str, Any]) -> str:
        tools = info.get("tools") or []
        if not tools or rng.random() < 0.2:
            return " ".join(rng.choice(RANDOM_WORDS) for _ in range(rng.randint(1, 4)))
        function = rng.choice(tools)["function"]
        arguments = {name: value(schema) for name, schema in function["parameters"]["properties"].items()}
        return f"<tool_call>{json.dumps({'name': function['name'], 'arguments': arguments})}</tool_call>"

    return act


def play_episodes(env_id: str, policy_name: str, policy: Policy, episodes: int, seed: int) -> DemoResult:
    """Play `episodes` episodes (seeds seed, seed+1, ...) and average their returns and lengths."""
    from envhub.registry import make

    start = time.perf_counter()
    returns, lengths = [], []
    env = None
    try:
        env = make(env_id)
        for episode in range(episodes):
            _, info = env.reset(seed=seed + episode)
            total, steps = 0.0, 0
            for steps in range(1, MAX_STEPS + 1):
                action = policy(env, info)
                if action is None:  # the solver has nothing to say: count the episode as it stands
                    steps -= 1
                    break
                _, reward, terminated, truncated, info = env.step(action)
                total += float(reward)
                if terminated or truncated:
                    break
            returns.append(total)
            lengths.append(steps)
    except Exception as exc:  # a broken env is reported in its row, never fatal to the demo
        return DemoResult(
            env_id,
            policy_name,
            len(returns),
            _mean(returns),
            _mean(lengths),
            time.perf_counter() - start,
            f"{type(exc).__name__}: {exc}",
        )
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass
    return DemoResult(env_id, policy_name, episodes, _mean(returns), _mean(lengths), time.perf_counter() - start)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def bundled_env_ids() -> list[str]:
    """Ids of envhub's own single-agent envs."""
    from envhub.registry import list_envs

    return [s.id for s in list_envs() if s.source == "envhub" and not s.multiagent]


def run_demo(env_ids: Sequence[str], episodes: int = 3, seed: int = 0) -> list[DemoResult]:
    """Play each env with its solver (if it has one) and with the random policy."""
    from envhub.registry import spec

    results = []
    for env_id in env_ids:
        try:
            has_solver = callable(getattr(spec(env_id).load(), "oracle_action", None))
        except Exception as exc:  # unknown id or unimportable entry point: one row says so
            results.append(DemoResult(env_id, "-", 0, 0.0, 0.0, 0.0, f"{type(exc).__name__}: {exc}"))
            continue
        if has_solver:
            results.append(play_episodes(env_id, "solver", oracle_policy, episodes, seed))
        results.append(play_episodes(env_id, "random", make_random_policy(seed), episodes, seed))
    return results


def format_table(results: Sequence[DemoResult]) -> str:
    """The results as an aligned text table."""
    header = ("env", "policy", "episodes", "mean return", "mean steps", "seconds")
    rows = [
        (r.env_id, r.policy, str(r.episodes), f"{r.mean_return:.3f}", f"{r.mean_steps:.1f}", f"{r.seconds:.2f}")
        for r in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    for row, result in zip(rows, results):
        error = f"  error: {result.error[:120]}" if result.error else ""
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + error)
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo and print the table; returns 1 when any row failed, else 0."""
    parser = argparse.ArgumentParser(prog="python -m envhub.cli.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="*", help="env ids to play (default: every bundled single-agent env)")
    parser.add_argument("--episodes", type=int, default=3, help="episodes per env and policy")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    import envhub  # noqa: F401  (registers the bundled envs)

    env_ids = args.envs or bundled_env_ids()
    print(
        f"envhub demo: {len(env_ids)} envs x {args.episodes} seeded episodes (seeds "
        f"{args.seed}..{args.seed + args.episodes - 1})\n"
    )
    results = run_demo(env_ids, episodes=args.episodes, seed=args.seed)
    print(format_table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([asdict(r) for r in results], handle, indent=2)
    failed = [r for r in results if r.error]
    if failed:
        print(f"\n{len(failed)} of {len(results)} rows failed: {', '.join(sorted({r.env_id for r in failed}))}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
