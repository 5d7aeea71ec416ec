"""envhub envs in verl's agent loop (verl 0.7 to 0.9): `pip install 'envhub[verl]'`.

verl's `AgentLoopWorker` reads a YAML list of agent loops (`actor_rollout_ref.rollout.agent.agent_loop_config_path`),
builds one loop object per sample (hydra `instantiate`) and awaits `run(sampling_params, **row)`; each dataset row
picks its loop with `agent_name`. `EnvhubAgentLoop` plays the row's env (`extra_info.env_id`, `extra_info.seed`)
with verl's server manager generating, in the token layout of envhub's own trainer, and returns the episode's
return as `reward_score` (verl writes it as `rm_scores`: no reward function needed).

- `write_agent_loop_config(path)`: that YAML (`name: envhub`, `_target_: envhub.integrations.verl.EnvhubAgentLoop`,
  settings such as `max_turns`, `env_kwargs` and `imports` for envs of your own).
- `write_dataset(path, env_ids, seeds)`: the parquet verl's `RLHFDataset` reads.
- `main_ppo_overrides(...)`: command-line overrides for `python -m verl.trainer.main_ppo` training on those files
  with GRPO (checked against verl's config schema by the tests; running it needs verl's GPU rollout servers).
- `EnvhubAgentLoop`: the loop class; importing it imports verl.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import uuid4

import envhub
from envhub.errors import ConfigError, EnvhubError
from envhub.integrations.episode import play_episode
from envhub.user_modules import load_user_modules

AGENT_NAME = "envhub"
LOOP_TARGET = f"{__name__}.EnvhubAgentLoop"


def write_agent_loop_config(
    path: str | Path,
    *,
    name: str = AGENT_NAME,
    max_turns: int = 8,
    max_new_tokens: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    imports: Sequence[str] = (),
) -> Path:
    """Write verl's agent-loop YAML with one envhub loop; settings become `EnvhubAgentLoop` keyword arguments."""
    import yaml

    entry: dict[str, Any] = {"name": name, "_target_": LOOP_TARGET, "max_turns": int(max_turns)}
    if max_new_tokens is not None:
        entry["max_new_tokens"] = int(max_new_tokens)
    if env_kwargs:
        entry["env_kwargs"] = dict(env_kwargs)
    if imports:
        entry["imports"] = list(imports)
    path = Path(path)
    path.write_text(yaml.safe_dump([entry], sort_keys=False))
    return path


def write_dataset(
    path: str | Path, env_ids: str | Sequence[str], seeds: Sequence[int], *, agent_name: str = AGENT_NAME
) -> Path:
    """Write a parquet of one row per (env, seed) in verl's dataset layout: `prompt` (the env's system prompt),
    `agent_name`, `data_source`, `reward_model` and `extra_info` {env_id, seed, index}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for env_id in [env_ids] if isinstance(env_ids, str) else list(env_ids):
        env = envhub.make(env_id)
        try:
            _, info = env.reset(seed=0)
        finally:
            env.close()
        system = str(info.get("system_prompt") or "")
        prompt = [{"role": "system", "content": system}] if system else [{"role": "user", "content": ""}]
        for seed in seeds:
            rows.append(
                {
                    "data_source": f"envhub/{env_id}",
                    "prompt": prompt,
                    "agent_name": agent_name,
                    "ability": "agent",
                    "reward_model": {"style": "env", "ground_truth": ""},  # the env scores: reward_score
                    "extra_info": {"env_id": env_id, "seed": int(seed), "index": len(rows)},
                }
            )
    path = Path(path)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def main_ppo_overrides(
    train_files: str | Path,
    agent_loops: str | Path,
    model: str,
    *,
    val_files: str | Path | None = None,
    group_size: int = 4,
    batch_size: int = 16,
    max_prompt_length: int = 1024,
    max_response_length: int = 2048,
    steps: int = 100,
    gpus: int = 1,
    rollout: str = "vllm",
) -> list[str]:
    """`key=value` overrides for verl's `main_ppo`: GRPO over the parquet and agent-loop YAML written above."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train_files}",
        f"data.val_files={val_files or train_files}",
        f"data.train_batch_size={batch_size}",
        f"data.max_prompt_length={max_prompt_length}",
        f"data.max_response_length={max_response_length}",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.rollout.name={rollout}",
        f"actor_rollout_ref.rollout.n={group_size}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_size}",
        f"trainer.n_gpus_per_node={gpus}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[console]",
    ]


def __getattr__(name: str) -> Any:
    """`EnvhubAgentLoop` is built on first use, since it subclasses verl's `AgentLoopBase`."""
    if name == "EnvhubAgentLoop":
        globals()[name] = cls = _agent_loop_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _agent_loop_class() -> type:
    try:
        from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
    except ImportError as exc:
        raise EnvhubError(
            f"verl's agent loop cannot be imported ({type(exc).__name__}: {exc})",
            hint="pip install 'envhub[verl]'  (verl>=0.7,<0.10 with the cachetools and uvicorn it imports)",
        ) from exc

    class EnvhubAgentLoop(AgentLoopBase):
        """Plays one envhub episode per sample: the row's `extra_info` names the env and the seed."""

        def __init__(
            self,
            *args: Any,
            env_id: str | None = None,
            max_turns: int = 8,
            max_new_tokens: int | None = None,
            env_kwargs: dict[str, Any] | None = None,
            imports: Sequence[str] = (),
            **kwargs: Any,
        ) -> None:
            kwargs.pop("name", None)  # the YAML entry's own name comes along with its settings
            super().__init__(*args, **kwargs)
            load_user_modules(imports, option="agent loop imports:")  # cached: each worker imports once
            self.env_id = env_id
            self.max_turns = int(max_turns)
            self.max_new_tokens = max_new_tokens
            self.env_kwargs = dict(env_kwargs or {})
            self.response_length = int(self.config.actor_rollout_ref.rollout.response_length)

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
            extra = dict(kwargs.get("extra_info") or {})
            env_id = extra.get("env_id") or self.env_id
            if not env_id:
                raise ConfigError(
                    "a verl sample names no envhub env", hint="set extra_info.env_id (write_dataset does) or env_id"
                )
            seed = extra.get("seed", kwargs.get("index"))
            raw_prompt = kwargs.get("raw_prompt")  # may be a numpy array: never truth-tested
            prompt = [dict(m) for m in raw_prompt] if raw_prompt is not None else []
            request_id, generate_s = uuid4().hex, 0.0  # one request id per episode: verl routes it to one server

            async def generate(ids: list[int], max_new_tokens: int) -> tuple[list[int], list[float] | None]:
                nonlocal generate_s
                started = time.perf_counter()
                params = {**sampling_params, "max_new_tokens": max_new_tokens}  # vLLM and SGLang servers read it
                out = await self.server_manager.generate(request_id=request_id, prompt_ids=ids, sampling_params=params)
                generate_s += time.perf_counter() - started
                return list(out.token_ids), None if out.log_probs is None else list(out.log_probs)

            started = time.perf_counter()
            env = envhub.make(env_id, **self.env_kwargs)
            try:
                episode = await play_episode(
                    env,
                    self.tokenizer,
                    generate,
                    seed=None if seed is None else int(seed),
                    prompt=prompt,
                    max_turns=self.max_turns,
                    max_response_tokens=self.response_length,
                    max_new_tokens=self.max_new_tokens,
                )
            finally:
                await env.aclose()
            metrics = AgentLoopMetrics(
                generate_sequences=generate_s, tool_calls=time.perf_counter() - started - generate_s
            )
            return _loop_output(AgentLoopOutput, episode, metrics, env_id)

    EnvhubAgentLoop.__module__ = __name__  # hydra and pickling find it here
    return EnvhubAgentLoop


def _loop_output(output_cls: type, episode: Any, metrics: Any, env_id: str) -> Any:
    """verl's AgentLoopOutput for a played episode."""
    return output_cls(
        prompt_ids=episode.prompt_ids,
        response_ids=episode.response_ids,
        response_mask=episode.response_mask,
        response_logprobs=episode.logprobs,
        reward_score=episode.reward,
        num_turns=2 * episode.turns,  # the first observation, then the model's turns and the env's replies
        metrics=metrics,
        extra_fields={"turn_scores": episode.turn_rewards, "env_id": env_id, "finish_reason": episode.finish_reason},
    )
