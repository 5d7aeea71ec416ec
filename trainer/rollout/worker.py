"""Rollouts: one asyncio task per episode, turning env text into token ids with loss masks.

The conversation is kept as a list of token ids that only ever grows. Each turn appends:
- the model's sampled ids exactly as the engine returned them (loss mask 1, behaviour logprobs, version);
- template text the model did not write (the end of its turn after a length cut, the newline after
  its end-of-turn token, the next observation message and the generation prompt), mask 0.

The template deltas come from `envhub.chat_tokens.ChatTokens`, which never re-tokenizes earlier ids. Each model turn
is also kept as a `TurnSpan` (its sampled tokens' span, the env's reward for it, the anchor of the state it acted in)
for step-level credit.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envhub.chat_tokens import ChatTokens, chat_stop_ids
from envhub.inference import InferenceEngine, SamplingParams
from envhub.registry import as_async
from envhub.trainer.config import RolloutConfig
from envhub.trainer.engines import episode_key
from envhub.trainer.trajectory import Trajectory, TurnSpan, anchor_key

EnvFactory = Callable[[], Any]


@dataclass
class _Episode:
    """Mutable state of an episode in progress (so a timeout still yields what was played)."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    turn_log: list[dict[str, Any]] = field(default_factory=list)
    spans: list[TurnSpan] = field(default_factory=list)
    sampling_key: str | None = None  # with rollout.seeded: the episode's part of each request's sampling seed
    stage: str = "build"  # what the episode is doing: build, reset, generate or step (named by an error)
    started: float = field(default_factory=time.monotonic)

    def since_start(self) -> float:
        """Seconds since the episode started (a turn's `at`: when its stage began, for `envhub plan`)."""
        return time.monotonic() - self.started

    def extend(self, ids: list[int], logprobs: list[float] | None = None, versions: list[int] | None = None) -> None:
        self.ids += ids
        self.mask += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.versions += versions if versions is not None else [-1] * len(ids)

    def trajectory(self, task: str, group_id: str, seed: int, finish: str, duration_s: float) -> Trajectory:
        """What was played, as the learner and the run record see it."""
        return Trajectory(
            input_ids=self.ids,
            loss_mask=self.mask,
            behavior_logprobs=self.logprobs,
            versions=self.versions,
            reward=self.reward,
            task=task,
            group_id=group_id,
            seed=seed,
            turns=self.turns,
            finish_reason=finish,  # type: ignore[arg-type]
            env_info=self.info,
            duration_s=duration_s,
            turn_log=self.turn_log,
            turn_spans=self.spans,
        )


def sampling_seed(key: str, turn: int) -> int:
    """A request's sampling seed from its episode's key and turn: stable across processes (unlike `hash`), and
    below 2**31 as OpenAI-compatible servers take it."""
    digest = hashlib.blake2b(f"{key}|{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 2**31


class RolloutWorker:
    """Plays episodes of any registered (local or remote) env against an InferenceEngine."""

    def __init__(self, engine: InferenceEngine, tokenizer: Any, config: RolloutConfig | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config or RolloutConfig()
        self.stop_ids = chat_stop_ids(tokenizer)
        self.episodes_cancelled = 0
        self.episodes_timed_out = 0
        self.episodes_running = 0
        self.on_episode: Callable[[Trajectory], None] | None = None  # sees every episode that ends, cancelled ones too

    async def run_episode(
        self, make_env: EnvFactory, task: str, seed: int, group_id: str = "", episode: int = 0
    ) -> Trajectory:
        """Play one episode to its end or a limit; the env is always closed.

        `episode` is its index in the group: with `rollout.seeded`, it seeds the episode's sampling with the rest.

        An exception of the env or the engine ends the episode with finish_reason "error", the error text in
        `env_info["error"]` and where it happened in `env_info["error_stage"]` (build, reset, generate or step);
        it is not raised: whoever consumes episodes counts errors (`envhub.trainer.run.errors`).
        """
        state = _Episode()
        episode_key.set(f"{group_id}/{id(state)}")  # this task's turns stay on one engine (prefix cache)
        started = state.started
        env: Any = None
        finish = "error"
        self.episodes_running += 1
        try:
            state.stage = "build"
            env = as_async(make_env())  # a factory's own gymnasium wrappers run on the async path too
            state.sampling_key = f"{task}|{seed}|{group_id}|{episode}" if self.config.seeded else None
            finish = await asyncio.wait_for(self._play(env, seed, state), timeout=self.config.episode_timeout_s)
        except TimeoutError:
            self.episodes_timed_out += 1
            finish = "timeout"
        except asyncio.CancelledError:
            self.episodes_cancelled += 1
            finish = "cancelled"
            raise
        except Exception as exc:
            state.info.update(error=f"{type(exc).__name__}: {exc}"[:2000], error_stage=state.stage)
        finally:
            self.episodes_running -= 1
            if env is not None:
                await _close(env)
            trajectory = state.trajectory(task, group_id, seed, finish, time.monotonic() - started)
            if self.on_episode is not None:
                self.on_episode(trajectory)
        return trajectory

    async def _play(self, env: Any, seed: int, state: _Episode) -> str:
        cfg = self.config
        reset_at = state.since_start()
        state.stage = "reset"
        obs, info = await env.areset(seed=seed)
        state.turn_log.append(
            {
                "kind": "reset",
                "observation": obs,
                "system_prompt": info.get("system_prompt", ""),
                "at": reset_at,
                "env_s": state.since_start() - reset_at,
            }
        )
        state.info = {k: v for k, v in info.items() if k not in ("tools", "system_prompt") and _is_plain(v)}
        anchor = anchor_key(info, obs)
        chat = ChatTokens(self.tokenizer, tools=info.get("tools"))
        first = [{"role": "system", "content": info["system_prompt"]}] if info.get("system_prompt") else []
        state.extend(chat.add_messages(first + [{"role": "user", "content": obs}]))
        while True:
            budget = cfg.max_total_tokens - len(state.ids)
            if budget <= 0:
                return "max_tokens"
            sampling = SamplingParams(
                max_new_tokens=min(cfg.max_new_tokens, budget),
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                stop_token_ids=tuple(sorted(self.stop_ids)),
                seed=None if state.sampling_key is None else sampling_seed(state.sampling_key, state.turns),
            )
            generate_started = time.monotonic()
            state.stage = "generate"
            result = await self.engine.generate(list(state.ids), sampling)
            turn = {
                "kind": "turn",
                "at": generate_started - state.started,
                "generate_s": time.monotonic() - generate_started,
                "prompt_tokens": len(state.ids),
                "new_tokens": len(result.output_ids),
                "engine_finish": result.finish_reason,
                "anchor": anchor,
            }
            if "engine_url" in result.meta:  # several servers: the one that generated this turn
                turn["engine"] = result.meta["engine_url"]
            state.turn_log.append(turn)
            versions = getattr(result, "token_versions", None) or [result.weight_version] * len(result.output_ids)
            span_start = len(state.ids)
            state.extend(list(result.output_ids), list(result.logprobs), list(versions))
            span = (span_start, len(state.ids))
            state.turns += 1
            action, closing = chat.add_assistant(list(result.output_ids), self.stop_ids)
            turn["text"] = action
            state.extend(closing)
            step_started = time.monotonic()
            state.stage = "step"
            obs, reward, terminated, truncated, step_info = await env.astep(action)
            turn.update(
                env_at=step_started - state.started,
                env_s=time.monotonic() - step_started,
                observation=obs,
                reward=float(reward),
            )
            state.reward += float(reward)
            state.spans.append(TurnSpan(*span, reward=float(reward), anchor=anchor))
            # the env's own verdict, as of its latest step (the run record counts successes by it)
            verdict = {k: step_info[k] for k in ("success", "progress") if k in step_info}
            state.info.update({k: v for k, v in verdict.items() if _is_plain(v)})
            turn["span"] = list(span)
            anchor = anchor_key(step_info, obs)
            if terminated:
                return "terminated"
            if truncated:
                return "truncated"
            if state.turns >= cfg.max_turns:
                return "max_turns"
            if len(state.ids) >= cfg.max_total_tokens:
                return "max_tokens"
            state.extend(chat.add_messages([{"role": "user", "content": obs}]))


async def _close(env: Any) -> None:
    try:
        if hasattr(env, "aclose"):
            await env.aclose()
        else:
            env.close()
    except Exception:  # closing must never mask the episode's own outcome
        pass


def _is_plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None
