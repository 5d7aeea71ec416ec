"""`envhub eval ENV --agent MODEL --harness HARNESS`: evaluate an external agent program (a built-in harness or
any command line) on envs, its model calls served by MODEL through the recording gateway.

Each episode's record in episodes.jsonl lists its model calls (prompt and output token ids, logprobs, policy
versions) and whether they merged into one trajectory; summary.json gives per env the episodes, mean reward,
success rate, errors and the share of merged episodes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError

MODEL_HELP = (
    "use smollm2, tiny or hf:DIR (served by the embedded engine), or vllm:URL#MODEL (a running vLLM server, e.g. "
    "`envhub serve-engine --backend vllm`, whose MODEL is smollm2, tiny or hf:DIR for the tokenizer): engines whose "
    "tokens can be recorded"
)


def vllm_spec(spec: str) -> tuple[str, str] | None:
    """(URL, MODEL) of a `vllm:URL#MODEL` agent spec, None for any other spec; ConfigError for a malformed one."""
    spec = spec.strip()
    if not spec.startswith("vllm:"):
        return None
    url, _, model = spec.removeprefix("vllm:").partition("#")
    if not url.startswith(("http://", "https://")) or not model:
        raise ConfigError(f"--agent {spec!r} is not vllm:URL#MODEL", hint=MODEL_HELP)
    return url, model


def model_name(spec: str) -> str:
    """The model (for the tokenizer and the embedded engine) of an agent spec; ConfigError for specs the gateway
    cannot serve."""
    spec = spec.strip()
    vllm = vllm_spec(spec)
    if vllm is not None:
        return model_name(vllm[1])
    if spec in ("smollm2", "tiny"):
        return spec
    if spec.startswith("hf:") and spec.removeprefix("hf:"):
        return spec.removeprefix("hf:")
    raise ConfigError(f"--agent {spec!r} cannot serve a harness", hint=MODEL_HELP)


def open_engine(spec: str, api_key: str | None) -> tuple[Any, Any]:
    """The engine and tokenizer an agent spec names: a real vLLM server it attaches to, or an embedded engine."""
    vllm = vllm_spec(spec)
    if vllm is not None:
        from envhub.trainer.engines.vllm.engine import VLLMEngine
        from envhub.trainer.models import load_tokenizer

        return VLLMEngine(vllm[0], api_key=api_key), load_tokenizer(model_name(spec))
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine

    engine = EmbeddedEngine.from_pretrained(model_name(spec))
    return engine, engine.tokenizer


async def _play_all(
    args: argparse.Namespace, out: Path | None, env_kwargs: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    from envhub.trainer.gateway import Gateway, GatewayConfig
    from envhub.trainer.harness import HarnessEnv

    key = getattr(args, "api_key", None) or os.environ.get("ENVHUB_ENGINE_API_KEY")
    engine, tokenizer = open_engine(args.agent, key)
    config = GatewayConfig(max_tokens_per_request=args.max_tokens, temperature=args.temperature)
    gateway = Gateway(engine, tokenizer, config)
    local = args.harness_runner == "local"
    harnesses = {
        env_id: HarnessEnv(
            env_id,
            args.harness,
            gateway,
            runner=args.harness_runner,
            allow_unsafe=local,
            wall_clock_s=args.episode_timeout,
            env_kwargs=env_kwargs,
        )
        for env_id in args.envs
    }
    limit = asyncio.Semaphore(max(1, args.concurrency))
    records: list[dict[str, Any]] = []
    sink = open(out / "episodes.jsonl", "w") if out else None

    async def play(env_id: str, seed: int) -> None:
        async with limit:
            episode = await harnesses[env_id].play(seed, group_id=f"{env_id}/{seed}")
        record = {"env": env_id, "seed": seed, "agent": args.agent, "harness": args.harness, **episode.as_record()}
        records.append(record)
        if sink:
            sink.write(json.dumps(record) + "\n")
            sink.flush()
        if episode.error and not args.quiet:
            print(f"envhub: {env_id} seed {seed}: {episode.error.splitlines()[0]}", file=sys.stderr)

    await gateway.start()
    try:
        await asyncio.gather(*(play(e, args.seed + i) for e in args.envs for i in range(args.n)))
    finally:
        await gateway.stop()
        await engine.close()
        if sink:
            sink.close()
    return summarize(records, args.success_threshold)


def summarize(records: list[dict[str, Any]], threshold: float) -> dict[str, dict[str, Any]]:
    """Per env: episodes, mean reward, success rate, errors and the share of merged episodes (of those without one)."""
    summary: dict[str, dict[str, Any]] = {}
    for env_id in dict.fromkeys(r["env"] for r in records):
        rows = [r for r in records if r["env"] == env_id]
        played = [r for r in rows if not r["error"]]
        summary[env_id] = {
            "episodes": len(rows),
            "mean_reward": round(sum(r["reward"] for r in rows) / len(rows), 6),
            "success_rate": round(sum(r["reward"] >= threshold for r in rows) / len(rows), 6),
            "errors": len(rows) - len(played),
            "merged_share": round(sum(r["merged"] for r in played) / len(played), 6) if played else None,
            "calls_per_episode": round(sum(len(r["calls"]) for r in rows) / len(rows), 3),
        }
    return summary


def cmd_harness_eval(args: argparse.Namespace) -> int:
    """Run the harness on every env's tasks, write episodes.jsonl and summary.json, print one line per env."""
    from envhub.trainer.harness.builtin import resolve

    model_name(args.agent)  # a bad spec fails before any model loads
    try:
        env_kwargs = json.loads(args.kwargs) if args.kwargs else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--kwargs is not JSON: {exc}", hint='e.g. --kwargs \'{"turns": 3}\'') from None
    resolve(args.harness, sandboxed=args.harness_runner != "local")  # likewise a missing harness package
    if args.harness_runner == "local":
        print("envhub: --harness-runner local runs the harness on this machine WITHOUT a sandbox", file=sys.stderr)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    summary = asyncio.run(_play_all(args, out, env_kwargs))
    for env_id, row in summary.items():
        print(
            f"{env_id}: {row['episodes']} episodes, mean reward {row['mean_reward']}, success {row['success_rate']}, "
            f"errors {row['errors']}, merged {row['merged_share']}"
        )
    if out:
        seconds = round(time.monotonic() - started, 1)
        head = {"harness": args.harness, "agent": args.agent, "seconds": seconds}
        (out / "summary.json").write_text(json.dumps({**head, "envs": summary}, indent=2))
        print(f"wrote {out}/summary.json and {out}/episodes.jsonl")
    return 1 if any(row["errors"] == row["episodes"] for row in summary.values()) else 0


def add_options(p: argparse.ArgumentParser) -> None:
    """eval's harness options."""
    p.add_argument(
        "--harness",
        default=None,
        help="run an external agent program with --agent served through the recording gateway: openai-agents or "
        "any command line (docs/harnesses.md)",
    )
    p.add_argument(
        "--harness-runner",
        default="bwrap",
        choices=("bwrap", "local"),
        help="bwrap: a sandbox whose only way out is the gateway (default); local: no isolation, development only",
    )
