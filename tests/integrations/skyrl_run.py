"""SkyRL's own generator playing envhub envs through skyrl_gym: run by test_skyrl.py in a subprocess whose path has
the `skyrl` package (0.3.0, installed without its GPU dependencies) on it.

SkyRL's `PromptDataset` reads the parquet of `write_dataset` and `SkyRLGymGenerator.agent_loop` plays each row as in
training (token bookkeeping, loss mask, per-turn rewards); the inference client is envhub's EmbeddedEngine on the tiny
random Llama, or a FrozenLake solver reading the prompt. Prints one JSON summary.

usage: python skyrl_run.py WORKDIR
"""

from __future__ import annotations

import asyncio
import json
import sys
import typing
from pathlib import Path

import torch
import typing_extensions

# skyrl 0.3.0 declares Python >= 3.12: its pydantic models hold typing.TypedDicts, which pydantic accepts on
# Python 3.11 only from typing_extensions
typing.TypedDict = typing_extensions.TypedDict

from lake import lake_move, move_call  # noqa: E402  (this script's folder is on the path)
from skyrl.train.config import GeneratorConfig, SkyRLGymConfig, SkyRLTrainConfig  # noqa: E402
from skyrl.train.dataset.dataset import PromptDataset  # noqa: E402
from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator  # noqa: E402

from envhub.inference import SamplingParams  # noqa: E402
from envhub.integrations.skyrl import register, train_overrides, write_dataset  # noqa: E402
from envhub.trainer.engines.embedded.engine import EmbeddedEngine  # noqa: E402
from envhub.trainer.models import load_tokenizer, tiny_llama  # noqa: E402


class EngineClient:
    """SkyRL's inference-client calls, answered by envhub's EmbeddedEngine (real sampling and logprobs)."""

    def __init__(self, engine: EmbeddedEngine, tokenizer) -> None:
        self.engine, self.tokenizer, self.finished = engine, tokenizer, []

    async def generate(self, engine_input, model=None):
        (ids,) = engine_input["prompt_token_ids"]
        params = engine_input.get("sampling_params") or {}
        sampling = SamplingParams(
            max_new_tokens=int(params.get("max_tokens") or 24), stop_token_ids=tuple(self.engine.eos_token_ids)
        )
        result = await self.engine.generate(list(ids), sampling)
        out = list(result.output_ids)
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        stop = "stop" if out and out[-1] in self.engine.eos_token_ids else "length"
        return {
            "responses": [text],
            "response_ids": [out],
            "stop_reasons": [stop],
            "response_logprobs": [list(result.logprobs)],
        }

    async def finish_session(self, session_id):
        self.finished.append(session_id)


class SolverClient(EngineClient):
    """Answers with FrozenLake's shortest path, read from the decoded prompt."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.finished = tokenizer, []

    async def generate(self, engine_input, model=None):
        (ids,) = engine_input["prompt_token_ids"]
        text = move_call(lake_move(self.tokenizer.decode(ids)) or "up")
        out = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return {
            "responses": [text],
            "response_ids": [out],
            "stop_reasons": ["stop"],
            "response_logprobs": [[-0.25] * len(out)],
        }


async def play(client, tokenizer, dataset) -> list[dict]:
    generator = SkyRLGymGenerator(
        generator_cfg=GeneratorConfig(max_turns=4, max_input_length=4096),
        skyrl_gym_cfg=SkyRLGymConfig(max_env_workers=0),
        inference_engine_client=client,
        tokenizer=tokenizer,
    )
    rows = []
    for i in range(len(dataset)):
        prompt, env_class, extras, _ = dataset[i]
        out = await generator.agent_loop(
            prompt,
            env_class,
            extras,
            max_tokens=48,
            max_input_length=4096,
            sampling_params={"max_tokens": 24, "logprobs": 1},
        )
        rewards = out.reward if isinstance(out.reward, list) else [out.reward]
        rows.append(
            {
                "env_class": env_class,
                "seed": extras["seed"],
                "prompt": tokenizer.decode(out.prompt_ids),
                "response_tokens": len(out.response_ids),
                "loss_mask": list(out.loss_mask),
                "rewards": {str(j): r for j, r in enumerate(rewards) if r},
                "logprobs": None if out.rollout_logprobs is None else len(out.rollout_logprobs),
                "stop_reason": out.stop_reason,
                "env_metrics": out.env_metrics,
            }
        )
    return rows


def main(workdir: Path) -> None:
    torch.set_num_threads(1)
    tokenizer = load_tokenizer("tiny")
    registered = register(["FrozenLake-v0", "Letters-v0"], env_kwargs={"FrozenLake-v0": {"size": 3}})
    parquet = write_dataset(workdir / "train.parquet", ["FrozenLake-v0", "Letters-v0"], seeds=[2, 9])
    dataset = PromptDataset(str(parquet), tokenizer, max_prompt_length=512, num_workers=1)
    engine_client = EngineClient(EmbeddedEngine(tiny_llama(tokenizer).eval(), tokenizer), tokenizer)
    solver_client = SolverClient(tokenizer)
    result = {
        "registered": registered,
        "engine": asyncio.run(play(engine_client, tokenizer, dataset)),
        "solver": asyncio.run(play(solver_client, tokenizer, dataset))[:2],  # the FrozenLake rows
        "sessions_finished": [len(engine_client.finished), len(solver_client.finished)],
    }
    cfg = SkyRLTrainConfig.from_cli_overrides(train_overrides(parquet, "Qwen/Qwen3-0.6B", max_turns=6))
    result["config"] = {
        "train_data": list(cfg.data.train_data),
        "max_turns": cfg.generator.max_turns,
        "group_size": cfg.generator.n_samples_per_prompt,
        "env_class": cfg.environment.env_class,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
