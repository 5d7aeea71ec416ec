"""Evaluation: run an agent over N seeded tasks of each env, concurrently, and report pass@k and mean reward.

Episodes are one asyncio task each (at most `concurrency` at once). Task `i` of an env is the env reset
with seed `seeds[i]`; each task is attempted `samples` times (default: the largest k), every attempt
with its own deterministic agent seed. Multi-agent games are played seat by seat through
`SelfPlay` against `opponent` (simultaneous-move games as sealed turns: `SimultaneousTurns`).
Every finished episode is appended to `out_dir/episodes.jsonl` at once (turn by turn: action, observation, reward, tool
calls), so an interrupted run loses nothing and a
re-run skips what is done. Episodes that end in an error (endpoint down, 401, context length, ...) are
recorded with the error, counted in the summary, left out of the scores, and tried again on a re-run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envhub.agents.base import Agent, AgentError
from envhub.errors import ConfigError
from envhub.progress import progress_bar
from envhub.toolcalls import parse_tool_calls

AgentFactory = Callable[[], Agent]
OPPONENT_NAMES = {"random": "random", "expert": "perfect", "perfect": "perfect", "scripted": "scripted"}
MAX_TEXT = 20_000  # characters of one observation kept in episodes.jsonl


@dataclass(frozen=True)
class EpisodeKey:
    """Which episode: env, task seed, attempt, and the seat played in a multi-agent game."""

    env_id: str
    seed: int
    attempt: int
    seat: int | None = None

    @property
    def group(self) -> str:
        """The summary row this episode belongs to (`Env-v0`, or `Game-v0#seat0` per seat)."""
        return self.env_id if self.seat is None else f"{self.env_id}#seat{self.seat}"

    @property
    def agent_seed(self) -> int:
        """A deterministic seed for the agent's own randomness in this episode."""
        return zlib.crc32(f"{self.env_id}|{self.seed}|{self.attempt}|{self.seat}".encode())


@dataclass
class EpisodeRecord:
    """One evaluated episode as written to episodes.jsonl."""

    env_id: str
    seed: int
    attempt: int
    seat: int | None
    agent: str
    reward: float = 0.0
    success: bool = False  # `episode_success`: the env's own verdict when it gives one, else the reward threshold
    progress: float | None = None  # the env's last info["progress"] (0-100, BALROG's measure), when it reports one
    env_success: bool | None = None  # the env's last info["success"], when it reports one
    steps: int = 0
    finish: str = "error"  # terminated | truncated | max_turns | timeout | error
    error: str | None = None
    error_kind: str | None = None
    malformed_tool_calls: int = 0
    retries: int = 0
    duration_s: float = 0.0
    first_observation: str = ""
    turns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> EpisodeKey:
        return EpisodeKey(self.env_id, self.seed, self.attempt, self.seat)


@dataclass(frozen=True)
class EvalConfig:
    """Limits and scoring of an evaluation run."""

    max_turns: int = 200
    episode_timeout_s: float = 900.0
    success_threshold: float = 1.0  # an episode passes when its total reward reaches this
    opponent: Any = "random"  # multi-agent games: random | expert | scripted | an AgentFactory
    seats: tuple[int, ...] = (0, 1)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: env builders by id (e.g. a trainer's tasks with their kwargs, or remote envs); other ids: `envhub.make`
    env_factories: dict[str, Callable[[], Any]] = field(default_factory=dict)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n attempts with c successes: 1 - C(n-c, k) / C(n, k), as a stable product."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def summarize(records: Iterable[EpisodeRecord | dict[str, Any]], ks: Sequence[int]) -> dict[str, dict[str, Any]]:
    """`{group: {episodes, mean_reward, stderr, pass_at_k: {k: value}, errors}}` over the latest record of each
    episode."""
    latest: dict[tuple, dict[str, Any]] = {}
    for r in records:
        r = asdict(r) if isinstance(r, EpisodeRecord) else r
        latest[(r["env_id"], r["seed"], r["attempt"], r["seat"])] = r
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in latest.values():
        groups[EpisodeKey(r["env_id"], r["seed"], r["attempt"], r["seat"]).group].append(r)
    summary = {}
    for group in sorted(groups):
        rows = groups[group]
        scored = [r for r in rows if not r.get("error_kind")]
        rewards = [float(r["reward"]) for r in scored]
        n = len(rewards)
        mean = sum(rewards) / n if n else 0.0
        stderr = math.sqrt(sum((x - mean) ** 2 for x in rewards) / (n - 1) / n) if n > 1 else 0.0
        by_task: dict[int, list[bool]] = defaultdict(list)
        for r in scored:
            by_task[r["seed"]].append(bool(r["success"]))
        pass_k: dict[str, float | None] = {}
        for k in ks:
            values = [pass_at_k(len(s), sum(s), k) for s in by_task.values() if len(s) >= k]
            pass_k[str(k)] = round(sum(values) / len(values), 6) if values else None
        errors: dict[str, int] = defaultdict(int)
        for r in rows:
            if r.get("error_kind"):
                errors[r["error_kind"]] += 1
            if r.get("malformed_tool_calls"):
                errors["malformed_tool_call"] += int(r["malformed_tool_calls"])
        summary[group] = {
            "episodes": n,
            "mean_reward": round(mean, 6),  # no float noise (0.9999999999999998) in reports
            "stderr": round(stderr, 6),
            "pass_at_k": pass_k,
            "errors": dict(sorted(errors.items())),
        }
        progress = [float(r["progress"]) for r in scored if r.get("progress") is not None]
        if progress:  # suites with partial progress (BALROG's 0-100)
            summary[group]["progress"] = _mean_stderr(progress)
    return summary


def _mean_stderr(values: list[float]) -> dict[str, float]:
    """`{mean, stderr, episodes}` of `values` (stderr 0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    stderr = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1) / n) if n > 1 else 0.0
    return {"mean": round(mean, 6), "stderr": round(stderr, 6), "episodes": n}


class EpisodeLog:
    """episodes.jsonl: one JSON line per finished episode, flushed and synced as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.skipped_lines = 0

    def load(self) -> list[dict[str, Any]]:
        """Every readable record; a torn last line (a crash mid-write) is skipped and counted."""
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                self.skipped_lines += 1
        return records

    def append(self, record: EpisodeRecord) -> None:
        with self.path.open("a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # a torn line from a crash: start on a line of our own
                    f.write(b"\n")
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(record), default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())


def episode_keys(env_ids: Sequence[str], seeds: Sequence[int], samples: int, config: EvalConfig) -> list[EpisodeKey]:
    """Every episode of the run, in a fixed order (env, task, seat, attempt)."""
    from envhub.registry import spec

    keys = []
    for env_id in env_ids:
        multiagent = env_id not in config.env_factories and spec(env_id).multiagent
        seats: tuple[int | None, ...] = config.seats if multiagent else (None,)
        keys += [EpisodeKey(env_id, s, a, seat) for s in seeds for seat in seats for a in range(samples)]
    return keys


def make_env(key: EpisodeKey, config: EvalConfig) -> Any:
    """A fresh env for `key`: its factory, `envhub.make`, or a SelfPlay seat of a multi-agent turn game."""
    from envhub.registry import make, spec
    from envhub.selfplay import SelfPlay

    if key.env_id in config.env_factories:
        return config.env_factories[key.env_id]()
    if not spec(key.env_id).multiagent:
        return make(key.env_id, **config.env_kwargs)
    opponent: Any = OPPONENT_NAMES.get(config.opponent) if isinstance(config.opponent, str) else None
    if opponent is None:
        opponent = agent_opponent(config.opponent(), key)  # an AgentFactory: a fresh opponent agent per game
    if "parallel" in spec(key.env_id).tags:  # simultaneous moves as sealed turns, the agent's seat committing first
        from envhub.envs.games.simultaneous import SimultaneousTurns
        from envhub.registry import make_multiagent

        game = SimultaneousTurns(make_multiagent(key.env_id, **config.env_kwargs), first_seat=int(key.seat or 0))
        return SelfPlay(game, opponent=opponent, seat=key.seat)
    return SelfPlay(key.env_id, opponent=opponent, seat=key.seat, game_kwargs=config.env_kwargs or None)


def agent_opponent(agent: Agent, key: EpisodeKey) -> Callable[[str, list[str]], Any]:
    """A SelfPlay opponent policy played by `agent` (reset on its first move of the game)."""
    started = False

    async def policy(text: str, legal_moves: list[str]) -> str:
        nonlocal started
        info = {"legal_moves": legal_moves, "agent_seed": key.agent_seed + 1}
        if not started:
            agent.reset({**info, "system_prompt": "You are playing a board game. Reply with just your move."})
            started = True
        action = await agent.act(text, info)
        parsed = parse_tool_calls(action)
        return str(parsed.calls[0].arguments.get("move", "")) if parsed.calls else parsed.text

    return policy


async def run_episode(
    key: EpisodeKey, agent_factory: AgentFactory, config: EvalConfig, agent_name: str = ""
) -> EpisodeRecord:
    """Play one episode to its end or a limit; errors are recorded, never raised (cancellation excepted)."""
    record = EpisodeRecord(key.env_id, key.seed, key.attempt, key.seat, agent_name)
    started = time.monotonic()
    agent: Agent | None = None
    env: Any = None
    try:
        agent = agent_factory()
        record.agent = record.agent or agent.name
        record.finish = "env"  # building the env is the env's side: a constructor that raises is an env error
        env = make_env(key, config)
        await asyncio.wait_for(_play(env, agent, key, config, record), timeout=config.episode_timeout_s)
    except TimeoutError:
        record.finish, record.error_kind = "timeout", "timeout"
        record.error = f"the episode passed its {config.episode_timeout_s:g} s limit"
    except AgentError as exc:
        record.error_kind, record.error = exc.kind, str(exc)
    except Exception as exc:  # an env or agent bug ends this episode only
        record.error_kind = "env_error" if record.finish == "env" else "agent_error"
        record.error = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        record.retries = int(getattr(agent, "retries", 0) or 0)
        record.duration_s = round(time.monotonic() - started, 3)
        if env is not None:
            await _close(env)
        if agent is not None:
            await _close_agent(agent)
    if record.error_kind:
        record.finish = "timeout" if record.error_kind == "timeout" else "error"
    record.success = record.error_kind is None and episode_success(record, config.success_threshold)
    return record


def episode_success(record: EpisodeRecord, threshold: float) -> bool:
    """Whether an episode succeeded, by the env's own account first: its last `info["success"]`, else its last
    `info["progress"]` reaching 100 (BALROG's suites), else a return of at least `threshold`. A global reward
    threshold alone misjudged envs whose reward stays below 1 when solved (MiniGrid's 1 - 0.9 * steps / max_steps)."""
    return judged_success(record.env_success, record.progress, record.reward, threshold)


def judged_success(env_success: bool | None, progress: float | None, reward: float, threshold: float = 1.0) -> bool:
    """The success rule of `episode_success` on its parts (the trainer's run record judges episodes by it too)."""
    if env_success is not None:
        return env_success
    if progress is not None:
        return progress >= 100.0 - 1e-9
    return reward >= threshold - 1e-9


async def _play(env: Any, agent: Agent, key: EpisodeKey, config: EvalConfig, record: EpisodeRecord) -> None:
    agent.bind_env(env)
    record.finish = "env"  # which side failed, read by run_episode if something raises
    obs, info = await env.areset(seed=key.seed)
    record.first_observation = obs[:MAX_TEXT]
    if isinstance(info.get("progress"), (int, float)):
        record.progress = float(info["progress"])
    agent.reset({**info, "agent_seed": key.agent_seed})
    for _ in range(config.max_turns):
        record.finish = "agent"
        action = await agent.act(obs, info)
        record.finish = "env"
        obs, reward, terminated, truncated, info = await env.astep(action)
        parsed = parse_tool_calls(action)
        record.malformed_tool_calls += bool(parsed.errors)
        record.turns.append(
            {
                "action": action,
                "observation": obs[:MAX_TEXT],
                "reward": float(reward),
                "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in parsed.calls],
            }
        )
        record.reward += float(reward)
        record.steps += 1
        if isinstance(info.get("progress"), (int, float)):
            record.progress = float(info["progress"])
        if isinstance(info.get("success"), bool):
            record.env_success = info["success"]
        if terminated or truncated:
            record.finish = "terminated" if terminated else "truncated"
            return
    record.finish = "max_turns"


async def _close(env: Any) -> None:
    try:
        await env.aclose() if hasattr(env, "aclose") else env.close()
    except Exception:  # closing must not hide the episode's outcome
        pass


async def _close_agent(agent: Agent) -> None:
    """Release what the episode's agent holds (an agent built on a shared endpoint leaves the endpoint open)."""
    try:
        await agent.aclose()
    except Exception:  # closing must not hide the episode's outcome
        pass


async def evaluate(
    env_ids: Sequence[str],
    agent_factory: AgentFactory,
    episodes: int = 10,
    seeds: int | Sequence[int] = 0,
    concurrency: int = 8,
    out_dir: str | Path | None = None,
    *,
    k: Sequence[int] = (1,),
    samples: int | None = None,
    config: EvalConfig | None = None,
    agent_name: str = "",
    progress: bool = False,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Evaluate `agent_factory`'s agents on `env_ids`; returns the summary (written to out_dir/summary.json too).

    `seeds` is the first task seed (tasks seeds, seeds+1, ...) or an explicit list; with `out_dir`, episodes
    already in out_dir/episodes.jsonl without an error are skipped (resume).
    """
    config = config or EvalConfig()
    ks = sorted({int(x) for x in k})
    samples = samples if samples is not None else max(ks)
    task_seeds = list(range(seeds, seeds + episodes)) if isinstance(seeds, int) else list(seeds)
    if not ks or ks[0] < 1:
        raise ConfigError(f"k must be positive, got {list(k)}")
    if samples < ks[-1]:
        raise ConfigError(
            f"pass@{ks[-1]} needs at least {ks[-1]} attempts per task, got samples={samples}",
            hint="raise --samples or lower -k",
        )
    if concurrency < 1 or not task_seeds:
        raise ConfigError("concurrency and the number of episodes must be at least 1")
    _check_envs(env_ids, config)
    log = _open_run(out_dir, agent_name, env_ids, config) if out_dir is not None else None
    previous = log.load() if log else []
    done = {EpisodeKey(r["env_id"], r["seed"], r["attempt"], r["seat"]) for r in previous if not r.get("error_kind")}
    todo = [key for key in episode_keys(env_ids, task_seeds, samples, config) if key not in done]
    wanted = {
        (key.env_id, key.seed, key.attempt, key.seat) for key in episode_keys(env_ids, task_seeds, samples, config)
    }
    records: list[Any] = [r for r in previous if (r["env_id"], r["seed"], r["attempt"], r["seat"]) in wanted]
    semaphore = asyncio.Semaphore(concurrency)
    bar = progress_bar(len(todo), desc="eval", unit="ep") if progress else None

    async def one(key: EpisodeKey) -> None:
        async with semaphore:
            record = await run_episode(key, agent_factory, config, agent_name)
        records.append(record)
        if log:
            log.append(record)
        if on_episode:
            on_episode(record)
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(
                f"{key.group} reward {record.reward:.2f}" + (f" error {record.error_kind}" if record.error_kind else "")
            )

    try:
        await asyncio.gather(*(one(key) for key in todo))
    finally:
        if bar is not None:
            bar.close()
        summary = summarize(records, ks)
        if out_dir is not None:
            _write_json(Path(out_dir) / "summary.json", summary)
    return summary


def _check_envs(env_ids: Sequence[str], config: EvalConfig) -> None:
    from envhub.registry import spec

    for env_id in env_ids:
        if env_id not in config.env_factories:
            spec(env_id)  # an unknown id raises EnvNotFound with suggestions
    if isinstance(config.opponent, str) and config.opponent not in OPPONENT_NAMES:
        raise ConfigError(f"unknown opponent {config.opponent!r}", hint="use random, expert, scripted or an agent spec")


def _open_run(out_dir: str | Path, agent_name: str, env_ids: Sequence[str], config: EvalConfig) -> EpisodeLog:
    """Create out_dir (or reopen it to resume); a directory holding a run of another agent, or of the same agent
    under settings that change its episodes (turn limit, env kwargs, opponent, seats, pass threshold), is refused:
    resuming it would mix two evaluations in one summary."""
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    run_file = path / "run.json"
    settings = {
        "max_turns": config.max_turns,
        "env_kwargs": json.loads(json.dumps(config.env_kwargs, default=str)),
        "opponent": config.opponent if isinstance(config.opponent, str) else "agent",
        "seats": list(config.seats),
        "success_threshold": config.success_threshold,
    }
    if run_file.exists():
        earlier = json.loads(run_file.read_text())
        if earlier.get("agent", "") != agent_name:
            raise ConfigError(
                f"{path} holds an evaluation of agent {earlier.get('agent', '')!r}, not {agent_name!r}",
                hint="use another --out directory",
            )
        theirs = earlier.get("settings") or {}
        changed = [k for k in settings if k in theirs and theirs[k] != settings[k]]
        if changed:
            was = ", ".join(f"{k} {theirs[k]!r} (now {settings[k]!r})" for k in changed)
            raise ConfigError(
                f"{path} holds an evaluation run with other settings: {was}; resuming it would mix the two",
                hint=f"use another --out directory, or delete {path} to start over with these settings",
            )
    else:
        _write_json(run_file, {"agent": agent_name, "envs": list(env_ids), "settings": settings})
    return EpisodeLog(path / "episodes.jsonl")


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
