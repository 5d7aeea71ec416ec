"""verl's own classes driving `EnvhubAgentLoop`: run by test_verl.py in a subprocess whose path has verl on it.

verl's `RLHFDataset` reads the parquet of `write_dataset`, its `AgentLoopWorker` reads the YAML of
`write_agent_loop_config`, instantiates the loop per sample and pads the batch, exactly as in training; only the
inference server is envhub's (verl's servers are vLLM/SGLang on a GPU): the EmbeddedEngine on the tiny random Llama, or
a FrozenLake solver that reads the prompt. Prints one JSON summary per server.

usage: python verl_run.py WORKDIR
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import verl
from lake import lake_move, move_call
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.workers.rollout.replica import TokenOutput

from envhub.errors import EnvhubError
from envhub.inference import SamplingParams
from envhub.integrations.trl import use_tool_template
from envhub.integrations.verl import main_ppo_overrides, write_agent_loop_config, write_dataset
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.models import load_tokenizer, tiny_llama

PROMPT_LENGTH, RESPONSE_LENGTH = 1024, 512


class EngineServer:
    """verl's server-manager call, answered by envhub's EmbeddedEngine (real sampling and logprobs)."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine = engine
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.calls.append({"request_id": request_id, **{k: v for k, v in sampling_params.items() if k != "logprobs"}})
        sampling = SamplingParams(
            max_new_tokens=int(sampling_params["max_new_tokens"]),
            temperature=float(sampling_params.get("temperature", 1.0)),
            stop_token_ids=tuple(self.engine.eos_token_ids),
        )
        result = await self.engine.generate(list(prompt_ids), sampling)
        return TokenOutput(token_ids=list(result.output_ids), log_probs=list(result.logprobs))


class SolverServer:
    """Answers with FrozenLake's shortest path, read from the decoded prompt."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.calls.append({"request_id": request_id})
        reply = move_call(lake_move(self.tokenizer.decode(prompt_ids)) or "up")
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids))


def config(workdir: Path, model_dir: Path) -> object:
    base = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    loops = write_agent_loop_config(
        workdir / "agent_loops.yaml", max_turns=4, max_new_tokens=48, env_kwargs={"size": 3}
    )
    rollout = {
        "name": "vllm",  # only read to pick a server class, which the worker below never starts
        "prompt_length": PROMPT_LENGTH,
        "response_length": RESPONSE_LENGTH,
        "agent": {"agent_loop_config_path": str(loops), "default_agent_loop": "single_turn_agent"},
    }
    data = {"max_prompt_length": PROMPT_LENGTH, "max_response_length": RESPONSE_LENGTH, "return_raw_chat": True}
    return OmegaConf.merge(
        base, {"actor_rollout_ref": {"model": {"path": str(model_dir)}, "rollout": rollout}, "data": data}
    )


def worker_class(server):
    """verl's AgentLoopWorker with `server` as its inference client (0.9 calls it llm_client, 0.7 server_manager)."""
    if "llm_client" in inspect.signature(AgentLoopWorker.__init__).parameters:

        class Worker(AgentLoopWorker):
            def __init__(self, cfg):
                super().__init__(cfg, llm_client=server, reward_loop_worker_handles=None)

    else:

        class Worker(AgentLoopWorker):
            def __init__(self, cfg):
                self.server_manager = None  # the base class would build a manager over Ray servers otherwise
                super().__init__(cfg, servers=[], load_balancer_handle=None, reward_loop_worker_handles=None)
                self.server_manager = server

    return Worker


def batch(cfg, tokenizer, parquet: Path) -> DataProto:
    """What verl's trainer hands the rollout: RLHFDataset rows, collated, each repeated for its GRPO group."""
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tokenizer, config=cfg.data)
    rows = collate_fn([dataset[i] for i in range(len(dataset))])
    proto = DataProto.from_single_dict(rows).repeat(repeat_times=2, interleave=True)
    proto.meta_info.update({"global_steps": 1, "validate": False})
    return proto


def summary(out: DataProto, server) -> dict:
    b, nt = out.batch, out.non_tensor_batch
    mask = b["response_mask"]
    return {
        "keys": sorted(b.keys()),
        "shapes": {k: list(b[k].shape) for k in ("prompts", "responses", "response_mask", "input_ids")},
        "rm_scores": b["rm_scores"].sum(-1).tolist(),
        "model_tokens": mask.sum(-1).tolist(),
        "logprobs_on_env_tokens": float(b["rollout_log_probs"][mask == 0].abs().sum()),
        "logprobs_on_model_tokens": b["rollout_log_probs"][mask == 1].tolist()[:8],
        "num_turns": [int(x) for x in nt["__num_turns__"]],
        "env_ids": [str(x) for x in nt["env_id"]],
        "finish_reasons": [str(x) for x in nt["finish_reason"]],
        "turn_scores": [list(map(float, x)) for x in nt["turn_scores"]],
        "seeds": [int(x["seed"]) for x in nt["extra_info"]],
        "calls": server.calls,
    }


def checked_overrides(workdir: Path) -> dict:
    """main_ppo_overrides merged into verl's trainer config in struct mode, where an unknown key raises."""
    base = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    OmegaConf.set_struct(base, True)
    overrides = main_ppo_overrides(workdir / "train.parquet", workdir / "agent_loops.yaml", "Qwen/Qwen3-0.6B")
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist(overrides))
    rollout = merged.actor_rollout_ref.rollout
    loops = rollout.agent.agent_loop_config_path
    return {"adv_estimator": merged.algorithm.adv_estimator, "n": rollout.n, "loops": loops}


def main(workdir: Path) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)
    tokenizer = load_tokenizer("tiny")
    try:  # with TRL's Qwen2.5 template the tool schemas are in the prompt; SmolLM2's own ignores them
        tokenizer = use_tool_template(tokenizer)
    except EnvhubError:
        pass
    model_dir = workdir / "model"
    tiny_llama(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    cfg = config(workdir, model_dir)
    parquet = write_dataset(workdir / "train.parquet", "FrozenLake-v0", seeds=[3, 8])
    results = {}
    for name, server in (
        ("engine", EngineServer(EmbeddedEngine(tiny_llama(tokenizer).eval(), tokenizer))),
        ("solver", SolverServer(tokenizer)),
    ):
        worker = worker_class(server)(cfg)
        out = asyncio.run(worker.generate_sequences(batch(cfg, worker.tokenizer, parquet)))
        results[name] = summary(out, server)
        first = out.batch["responses"][0]
        results[name]["model_text"] = tokenizer.decode(first[out.batch["response_mask"][0].bool()])
        results[name]["prompt_text"] = tokenizer.decode(
            out.batch["prompts"][0][out.batch["attention_mask"][0][:PROMPT_LENGTH].bool()]
        )
    results["overrides"] = checked_overrides(workdir)
    results["verl_version"] = verl.__version__
    results["numpy"] = np.__version__
    print(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
