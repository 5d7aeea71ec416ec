"""Training configuration: dataclasses with defaults, loaded from YAML with clear errors for bad keys."""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from envhub.errors import ConfigError
from envhub.trainer.staleness import Staleness
from envhub.user_modules import resolve_target


@dataclass
class LoraConfig:
    """LoRA adapters (peft) instead of full fine-tuning; r = 0 trains every weight."""

    r: int = 0  #: adapter rank; 0 = LoRA off
    alpha: float = 16.0  #: LoRA scaling numerator (scale = alpha / r)
    dropout: float = 0.0  #: dropout on the adapter input
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )  #: module names to adapt


@dataclass
class ModelConfig:
    """Which policy to train."""

    name: str = "tiny"  #: "tiny" (random tiny Llama), "smollm2" (bundled SmolLM2-135M-Instruct) or a HF directory
    device: str = "auto"  #: "auto" (cuda if present, else cpu), "cpu" or "cuda"
    dtype: str = (
        "auto"  #: compute/engine dtype: "auto" (bf16 on cuda, fp32 on cpu), "float32" or "bfloat16" (masters stay fp32)
    )
    tiny_layers: int = 2  #: layers of the "tiny" model
    tiny_hidden: int = 64  #: hidden size of the "tiny" model
    tiny_heads: int = 4  #: attention heads of the "tiny" model (head_dim = tiny_hidden / tiny_heads; vLLM needs >= 32)
    lora: LoraConfig = field(default_factory=LoraConfig)  #: LoRA adapters (r > 0) instead of full fine-tuning


@dataclass
class RouterLaunchConfig:
    """sglang-router started in front of the launched servers (`python -m sglang_router.launch_router`)."""

    port: int = 30000  #: the router's port (generation goes there; weight updates still go to every server)
    policy: Literal["manual", "cache_aware", "round_robin", "random", "power_of_two"] = (
        "manual"  #: manual pins each episode (X-SMG-Routing-Key) to one server, keeping its prefix cache
    )
    health_check_endpoint: str = "/ready"  #: /health would generate, and fail on a paused server
    extra_args: list[str] = field(default_factory=list)  #: more launch_router flags


@dataclass
class SGLangLaunchConfig:
    """SGLang servers the trainer starts itself (`python -m sglang.launch_server`, CUDA only)."""

    python: str = ""  #: interpreter with SGLang installed (default: this one); SGLang pins its own torch
    model_path: str = ""  #: HF model directory to serve; "" = the initial policy, exported to RUN_DIR/weights/initial
    num_servers: int = 1  #: servers, each on engine.tp_size GPUs
    base_gpu_id: int = 0  #: first GPU of server 0; server i starts at base_gpu_id + i * tp_size
    host: str = "127.0.0.1"  #: where the servers (and router) listen; other hosts need engine.api_key
    port: int = 30001  #: server i listens on port + i
    mem_fraction_static: float = 0.0  #: GPU memory for weights + KV cache (0 = SGLang's choice; lower it colocated)
    enable_memory_saver: bool = False  #: --enable-memory-saver (release/resume memory occupation)
    skip_server_warmup: bool = False  #: --skip-server-warmup
    startup_timeout_s: float = 1800.0  #: how long a server may take to become ready
    extra_args: list[str] = field(default_factory=list)  #: more launch_server flags
    router: RouterLaunchConfig | None = None  #: start sglang-router in front of the servers


@dataclass
class EngineConfig:
    """Where rollouts are generated."""

    kind: str = "embedded"  #: embedded (alias local), sglang (servers attached or launched), vllm, or a registered kind
    url: str = ""  #: SGLang server URL(s), comma-separated, or a running vLLM server to attach to (kind vllm)
    launch: SGLangLaunchConfig | None = None  #: kind sglang: start the servers instead of attaching
    router_url: str = ""  #: kind sglang, attach: generate through this sglang-router (control calls go to each url)
    max_batch_size: int = 16  #: requests the embedded engine batches together
    prefix_cache_mb: float = 256.0  #: embedded engine: KV of earlier turns kept for reuse (0 = off)
    prefill_chunk: int = 512  #: embedded engine: prompt tokens per prefill step, interleaved with decoding (0 = whole)
    #: embedded engine, CPU: a prefill step's pieces as one sequence through the GEMMs, attention row by row; off until
    #: a make demo A/B in one sitting decides it (docs/engines.md)
    pack_prefill: bool = False
    dtype: Literal["auto", "float32", "bfloat16"] = (
        "auto"  #: embedded engine: auto = bf16 on CUDA, on CPUs with bf16 units (AMX), with a bf16 learner; else fp32
    )
    kv_cache_mb: float = 2048.0  #: embedded engine: KV cache budget; requests queue when it is full
    threads: int = 0  #: embedded engine, CPU: torch threads per model step (0 = the rule in docs/engines.md)
    #: embedded engine: nice levels above the trainer process for its compute thread, where the process may raise
    #: priority (root or CAP_SYS_NICE); 0 = the process's own (docs/engines.md, Sharing the cores)
    priority: int = 5
    cuda_graphs: bool = True  #: embedded engine on CUDA: replay decode steps from captured CUDA graphs
    pause_mode: Literal["retract", "in_place", "abort", "none"] = (
        "retract"  #: how a weight push pauses the server: retract/abort (resubmit), in_place (keep KV), none (wait)
    )
    api_key: str = ""  #: the server's --api-key (default: $ENVHUB_ENGINE_API_KEY)
    max_outage_s: float = (
        300.0  #: an engine server that stops answering is waited for this long (backoff), then the run stops
    )
    max_model_len: int = 0  #: vllm: context length (0 = the model's, at most 8192)
    kv_cache_gib: float = 2.0  #: vllm: KV cache memory of a launched server (VLLM_CPU_KVCACHE_SPACE)
    startup_timeout_s: float = 900.0  #: vllm: seconds a launched server may take to answer /health
    admin_api_key: str = ""  #: the server's --admin-api-key (weight, pause and abort routes then need it)
    tp_size: int = 1  #: tensor-parallel GPUs of each SGLang server
    weight_sync: Literal["disk", "tensor", "nccl", "http"] = (
        "disk"  #: how pushes travel: a saved directory; sglang: CUDA IPC tensors, an NCCL group; vllm: http (fetched)
    )
    servers: int = 1  #: kind vllm without engine.url: servers to launch (episodes spread over them)
    tensor_format: Literal["sglang", "safetensors"] = (
        "sglang"  #: weight_sync tensor: SGLang's CUDA IPC pickles, or safetensors (envhub serve-engine)
    )
    bucket_mb: float = 512.0  #: weight_sync tensor / nccl: most megabytes per update request
    group_backend: Literal["nccl", "gloo"] = "nccl"  #: weight_sync nccl: the group's backend (gloo: CPU, tests)
    group_address: str = "127.0.0.1"  #: weight_sync nccl / http: the trainer's address as the servers reach it


@dataclass
class TaskConfig:
    """One env in the multi-task mixture."""

    env: str = ""  #: registered env id, e.g. Math-v0
    weight: float = 1.0  #: sampling weight in the mixture
    kwargs: dict[str, Any] = field(default_factory=dict)  #: passed to envhub.make
    remote: str = ""  #: URL of an `envhub serve` host; empty for a local env
    #: an external agent program plays this task through the gateway (docs/harnesses.md): a built-in's name
    #: (openai-agents) or a command line; None = the trainer's own rollout loop plays it
    harness: str | None = None
    harness_env: dict[str, str] = field(default_factory=dict)  #: extra environment variables for the harness
    #: a harness that fails after calling the model: drop (the episode leaves its group) or zero (its calls train
    #: with reward 0, the policy's failure: e.g. the Agents SDK ends its run on a reply cut at max_tokens)
    harness_errors: Literal["drop", "zero"] = "drop"


@dataclass
class RolloutConfig:
    """How episodes are played."""

    group_size: int = 4  #: episodes per task seed (one GRPO group)
    redundancy: int = 0  #: extra episodes started per group; the first group_size to finish are kept
    max_turns: int = 4  #: model turns per episode
    max_new_tokens: int = 64  #: tokens per model turn
    max_total_tokens: int = 1024  #: tokens in the whole episode (prompt included)
    episode_timeout_s: float = 120.0  #: wall time before the watchdog cancels an episode
    temperature: float = 1.0  #: sampling temperature (the learner uses the same)
    top_p: float = 1.0  #: nucleus sampling
    #: each request samples from its own generator, seeded by (task, task seed, group, episode, turn): what is
    #: sampled no longer depends on how the engine batched requests, so a sync run repeats under any load
    seeded: bool = False
    concurrent_groups: int = 4  #: groups in flight at once
    max_task_errors: int = 16  #: stop the run when this many episodes of one task fail in a row (0 = never)
    task_sampling: Literal["fixed", "signal"] = (
        "fixed"  #: signal: a task's weight times the share of its recent groups whose rewards differed (floor 0.1)
    )


@dataclass
class ISCorrectionConfig:
    """Train-inference importance correction: a detached weight from pi_prox / mu (docs/trainer.md)."""

    level: Literal["none", "token", "sequence", "geometric"] = (
        "none"  #: per token, product over the sequence, or its geometric mean (exp of the mean log-ratio); none = off
    )
    cap: float = 2.0  #: truncate the weight at this value (verl's rollout_is_threshold; 0 = no truncation)
    mask_low: float = 0.0  #: drop tokens (token level) or sequences whose weight is below this (0 = no lower mask)
    mask_high: float = 0.0  #: drop tokens or sequences whose weight is above this, before truncation (0 = off)
    apply_weight: bool = True  #: multiply the loss by the weight; false = only mask (the variant keeps mu as anchor)


@dataclass
class AlgorithmConfig:
    """GRPO and optimiser settings."""

    mode: Literal["async", "sync"] = "async"  #: async overlaps rollout and learning; sync does not
    groups_per_step: int = 2  #: groups in one learner step
    lr: float = 1e-5  #: AdamW learning rate
    weight_decay: float = 0.0  #: AdamW weight decay
    grad_clip: float = 1.0  #: max gradient norm
    clip_low: float = 0.2  #: PPO ratio clip below 1
    clip_high: float = 0.28  #: PPO ratio clip above 1 (clip-higher)
    dual_clip: float = 0.0  #: PPO / decoupled: cap a negative-advantage token's loss at c |A| (0 = off, else > 1)
    scale_std: bool = True  #: divide advantages by the group std (and GiGPO's step-group std)
    advantage: Literal["grpo", "turn", "gigpo"] = (
        "grpo"  #: credit assignment: episode-level (grpo) or step-level (docs/trainer.md, "Credit assignment")
    )
    gamma: float = 0.95  #: turn / gigpo: discount of later turns' rewards in a turn's return (GiGPO uses 0.95)
    step_weight: float = 1.0  #: gigpo: weight omega of the step-level advantage beside the episode's (GiGPO: 1)
    kl_coef: float = 0.0  #: weight of k3 KL to the initial policy (0 = no reference model)
    max_staleness: float = 1  #: steps a group may run ahead of the learner (async); 0.5: half a step's groups
    stale: Literal["drop", "correct"] = "drop"  #: what to do with groups beyond max_staleness
    spare_groups: int = 0  #: groups started beyond the bound while the learner waits, to replace filtered ones
    tis_cap: float = 2.0  #: truncation C of pi_prox / mu and pi / mu weights: variant tis, decoupled, stale: correct
    pg_variant: Literal["ppo", "vanilla", "tis", "cispo", "topr", "decoupled", "gspo"] = (
        "ppo"  #: policy-gradient loss (docs/trainer.md, "Policy-gradient variants")
    )
    cispo_eps_low: float = 0.1  #: CISPO: importance weight clipped below at 1 - eps_low (>= 1: no lower bound)
    cispo_eps_high: float = 0.1  #: CISPO: importance weight clipped above at 1 + eps_high
    topr_positive_weight: float = 1.0  #: TOPR: scale of tokens with a positive advantage (plain REINFORCE)
    topr_negative_weight: float = 1.0  #: TOPR: scale of tokens with advantage <= 0 (ratio truncated to [0, 1])
    gspo_clip_low: float = 3e-4  #: GSPO: the sequence ratio's clip below 1 (the paper's 3e-4)
    gspo_clip_high: float = 4e-4  #: GSPO: the sequence ratio's clip above 1 (the paper's 4e-4)
    is_correction: ISCorrectionConfig = field(
        default_factory=ISCorrectionConfig
    )  #: train-inference importance weight / mask, composable with any pg_variant
    filter_zero_variance: bool = True  #: skip groups whose rewards are all equal
    max_filtered_in_a_row: int = 64  #: stop (converged) after this many zero-variance groups in a row
    micro_batch_size: int = 8  #: most sequences per forward/backward pass (0 = only the token budget limits)
    max_tokens_per_micro_batch: int = 16384  #: padded tokens (rows x longest row) per forward/backward pass
    warmup_steps: int = 0  #: steps of linear learning-rate warmup from 0
    lr_schedule: Literal["constant", "cosine"] = (
        "constant"  #: after warmup: constant, or cosine decay to 0 at budget.steps
    )
    zero_variance_tol: float = (
        1e-6  #: groups whose rewards differ by at most this carry no signal (filtered, advantage 0)
    )
    max_reward: float = 1.0  #: reward of a solved episode: groups all at it count towards "converged"
    max_initial_kl: float = 0.05  #: stop when the first step's KL(behaviour || learner) exceeds this (0 = no check)

    def validate(self) -> None:
        """Raise ConfigError for policy-gradient constants that cannot work."""
        for name in ("clip_low", "clip_high", "cispo_eps_low", "cispo_eps_high", "gspo_clip_low", "gspo_clip_high"):
            if getattr(self, name) < 0:
                raise ConfigError(f"algorithm.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.gamma <= 1:
            raise ConfigError(
                f"algorithm.gamma must be in (0, 1], got {self.gamma}",
                hint="1 credits every later reward in full; GiGPO uses 0.95",
            )
        if self.step_weight < 0:
            raise ConfigError(
                f"algorithm.step_weight must be >= 0, got {self.step_weight}", hint="GiGPO uses 1.0 (0 is grpo)"
            )
        if self.dual_clip and not self.dual_clip > 1:
            raise ConfigError(
                f"algorithm.dual_clip must be 0 (off) or above 1, got {self.dual_clip}",
                hint="Ye et al. and verl use 3.0: a negative-advantage token stops pushing once its ratio exceeds it",
            )
        if not self.tis_cap > 0:
            raise ConfigError(f"algorithm.tis_cap must be positive, got {self.tis_cap}", hint="Yao et al. use 2.0")
        for name in ("topr_positive_weight", "topr_negative_weight"):
            if getattr(self, name) < 0:
                raise ConfigError(f"algorithm.{name} must be >= 0, got {getattr(self, name)}", hint="TOPR uses 1.0")
        spec = self.is_correction
        for name in ("cap", "mask_low", "mask_high"):
            if getattr(spec, name) < 0:
                raise ConfigError(f"algorithm.is_correction.{name} must be >= 0 (0 = off), got {getattr(spec, name)}")
        if spec.mask_high and spec.mask_low >= spec.mask_high:
            raise ConfigError(
                f"algorithm.is_correction keeps weights in [mask_low, mask_high] = [{spec.mask_low}, {spec.mask_high}]"
                ", which is empty",
                hint="e.g. mask_low: 0.5, mask_high: 2.0 (verl's sequence rejection)",
            )


@dataclass
class BudgetConfig:
    """When training stops and how often it saves."""

    steps: int = 10  #: learner steps
    max_time_s: float = 0.0  #: RL wall-time limit from RL's start (evaluations, SFT not counted; 0 = none)
    max_run_s: float = 0.0  #: cap of the whole run, evaluations and SFT included: RL leaves the final one its time
    checkpoint_every: int = 5  #: steps between checkpoints (the last step always saves)
    checkpoint_keep: int = 3  #: newest checkpoints kept on disk (0 = all)
    checkpoint_max_shard_size: str = "5GB"  #: largest safetensors shard of a saved model


@dataclass
class LearnerConfig:
    """How the learner runs: processes, sharding, memory savers."""

    devices: int = 1  #: learner processes (one per GPU; gloo processes on CPU)
    strategy: Literal["ddp", "fsdp"] = "ddp"  #: replicate weights (ddp) or shard them with FSDP2 fully_shard (fsdp)
    gradient_checkpointing: bool = False  #: recompute decoder activations in backward (less memory, ~30% more compute)
    logprob_chunk_tokens: int = (
        2048  #: model tokens per vocabulary projection chunk ([chunk, vocab] fp32 logits at once)
    )
    train_layers: int = 0  #: RL trains only the top N decoder layers and the final norm (0 = every weight)
    threads: int = 0  #: CPU: torch threads of a learner step beside generation (0 = every core, docs/engines.md)
    #: nice levels above the trainer process for learner and SFT steps where allowed (as engine.priority); 0 = none
    priority: int = 5
    #: a micro-batch's rows that begin with the same tokens (a group's prompt) run those tokens through the model
    #: once, their keys and values shared by every row; exact, single-process and without gradient checkpointing
    share_prefix: bool = True


@dataclass
class SFTConfig:
    """Optional warm start: supervised fine-tuning on chat-format JSONL (envhub collect) before RL."""

    data: str = ""  #: JSONL of {"messages": [...], "tools": [...]} records (envhub collect)
    collect: int = 0  #: or: expert episodes per task (env solvers) collected into RUN_DIR/sft.jsonl first
    epochs: int = 1  #: passes over the data
    lr: float = 1e-5  #: AdamW learning rate
    batch_size: int = 4  #: conversations per step
    max_tokens: int = 1024  #: conversations are cut to this many tokens
    max_time_s: float = 0.0  #: wall-time limit of the stage (0 = none)
    train_layers: int = 0  #: fine-tune only the top N transformer layers and the final norm (0 = every weight)


@dataclass
class EvalConfig:
    """Greedy evaluation on fixed held-out seeds before and after training (RUN_DIR/eval.json)."""

    episodes: int = 0  #: episodes per task (seeds seed .. seed+episodes-1); 0 = no evaluation
    seed: int = 1_000_000  #: first held-out seed (training draws its seeds from the mixture's RNG)
    before: bool = True  #: evaluate the initial policy (before SFT and RL)
    after_sft: bool = True  #: also evaluate between the SFT stage and RL (SFT-only vs SFT+RL)
    temperature: float = 0.0  #: 0 = greedy; > 0 samples (for tasks whose prompt does not vary with the seed)
    #: turns an evaluated episode may take; 0 = rollout.max_turns (fewer asks for the same task done without waste)
    max_turns: int = 0
    #: wall time before an evaluated episode is cancelled and left out of the means (counted in eval.json). Longer
    #: than rollout.episode_timeout_s: a batch of held-out episodes shares the engine, so on a 2-core CPU one
    #: 12-turn Sokoban episode among 32 took more than 120 s (`envhub eval` has the same default)
    episode_timeout_s: float = 900.0


@dataclass
class MachineConfig:
    """The machine the run is meant for, as `envhub train --dry-run` places it (0 = what this machine has)."""

    gpus: int = 0  #: GPUs of the target machine; on a machine without CUDA the dry-run plans for one with these
    gpu_memory_gib: float = 0.0  #: memory of each GPU the run may use (e.g. 80 for an H100; 0 = read it here)


@dataclass
class TrainConfig:
    """A whole training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    tasks: list[TaskConfig] = field(default_factory=list)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    machine: MachineConfig = field(default_factory=MachineConfig)  #: the target machine of --dry-run
    seed: int = 0  #: seeds task sampling, env seeds and the model init
    out_dir: str = "runs/train"  #: checkpoints, metrics.jsonl, TensorBoard logs and reward PNG
    #: modules or .py files (relative to the config file) that register the tasks' envs; imported before the run
    #: and by every Ray env worker (like `envhub train --import`)
    imports: list[str] = field(default_factory=list)

    def validate(self) -> TrainConfig:
        """Raise ConfigError for values that cannot work together."""
        if not self.tasks:
            raise ConfigError("config has no tasks", hint="add `tasks: [{env: Math-v0}]`")
        for i, task in enumerate(self.tasks):
            if not task.env:
                raise ConfigError(f"tasks[{i}] has no env id", hint="set `env: Name-v0`")
            if task.weight <= 0:
                raise ConfigError(f"tasks[{i}].weight must be positive, got {task.weight}")
            if task.harness is not None:
                self._check_harness_task(i, task)
            elif task.harness_env or task.harness_errors != "drop":
                raise ConfigError(
                    f"tasks[{i}] sets harness_env or harness_errors but has no harness",
                    hint="add `harness: NAME_OR_COMMAND`, or drop those keys",
                )
        if self.rollout.group_size < 2:
            raise ConfigError(f"rollout.group_size must be at least 2 for GRPO, got {self.rollout.group_size}")
        if self.rollout.task_sampling == "signal" and not self.algorithm.filter_zero_variance:
            raise ConfigError(
                "rollout.task_sampling: signal weighs tasks by their share of groups the filter keeps, and "
                "algorithm.filter_zero_variance is false, so every group is kept",
                hint="set algorithm.filter_zero_variance: true, or rollout.task_sampling: fixed",
            )
        Staleness.from_config(self.algorithm).check(self.algorithm.groups_per_step)  # sync: the spares only
        self.algorithm.validate()
        if self.learner.devices < 1:
            raise ConfigError(f"learner.devices must be at least 1, got {self.learner.devices}")
        if self.engine.max_outage_s < 0:
            raise ConfigError(f"engine.max_outage_s must be >= 0 (0 = stop at once), got {self.engine.max_outage_s}")
        if self.algorithm.max_tokens_per_micro_batch < 1:
            raise ConfigError("algorithm.max_tokens_per_micro_batch must be positive", hint="e.g. 16384")
        if self.evaluation.episode_timeout_s <= 0 or self.rollout.episode_timeout_s <= 0:
            raise ConfigError(
                "evaluation.episode_timeout_s and rollout.episode_timeout_s must be positive seconds, got "
                f"{self.evaluation.episode_timeout_s} and {self.rollout.episode_timeout_s}",
                hint="they are watchdogs: an episode past its limit is cancelled (e.g. 900 and 120)",
            )
        if self.evaluation.max_turns < 0:
            raise ConfigError(
                f"evaluation.max_turns must be >= 0 (0 = rollout.max_turns), got {self.evaluation.max_turns}"
            )
        if self.model.tiny_heads < 1 or self.model.tiny_hidden % self.model.tiny_heads:
            raise ConfigError(
                f"model.tiny_hidden ({self.model.tiny_hidden}) must be a multiple of model.tiny_heads "
                f"({self.model.tiny_heads})"
            )
        if self.learner.train_layers < 0:
            raise ConfigError(
                "learner.train_layers must be 0 (every weight) or a number of top layers, "
                f"got {self.learner.train_layers}"
            )
        if self.learner.train_layers > 0 and self.model.lora.r > 0:
            raise ConfigError(
                "learner.train_layers and model.lora both choose which weights learn",
                hint="use one: LoRA adapters (model.lora.r) or the top layers (learner.train_layers)",
            )
        if self.model.lora.r > 0 and self.learner.devices > 1 and self.learner.strategy == "fsdp":
            raise ConfigError(
                "LoRA with learner.strategy fsdp is not supported", hint="use strategy: ddp (adapters are small)"
            )
        self.check_engine()
        return self

    def _check_harness_task(self, i: int, task: TaskConfig) -> None:
        """A harness task's own settings, and the run's settings a harness episode cannot honour."""
        from envhub.trainer.harness.builtin import BUILTIN

        where, names = f"tasks[{i}].harness", ", ".join(BUILTIN)
        words = task.harness.split() if task.harness else []
        if not words:
            raise ConfigError(
                f"{where} is empty", hint=f"name a built-in harness ({names}) or give a command line (python3 agent.py)"
            )
        if len(words) == 1 and "/" not in words[0] and task.harness not in BUILTIN:
            close = difflib.get_close_matches(task.harness, list(BUILTIN), n=1, cutoff=0.6)
            raise ConfigError(
                f"{where}: {task.harness!r} is not a built-in harness (built-ins: {names})",
                hint=f"did you mean {close[0]!r}?" if close else "or give a command line with its arguments or path",
            )
        if self.algorithm.advantage != "grpo":
            raise ConfigError(
                f"{where}: algorithm.advantage {self.algorithm.advantage} needs each model turn's reward, and a "
                "harness episode has one reward",
                hint="use algorithm.advantage: grpo",
            )
        if self.sft.collect:
            raise ConfigError(
                f"{where}: sft.collect records the env's own expert turns, not what the harness shows the model",
                hint="drop sft.collect, or give sft.data recorded through the harness",
            )
        if self.evaluation.episodes:
            raise ConfigError(
                f"{where}: evaluation.episodes plays each task with the trainer's own agent, not the harness",
                hint="set evaluation.episodes: 0 and evaluate with `envhub eval ENV --agent hf:DIR --harness H`",
            )

    def check_engine(self) -> None:
        """Have the engine kind check its settings. A kind that only a module in `imports:` (or `--import`)
        registers is checked when the run has imported it (`Trainer` does so before building the engine)."""
        from envhub.trainer.engines.kinds import engine_kind, is_engine_kind

        if is_engine_kind(self.engine.kind) or not self.imports:
            engine_kind(self.engine.kind).check(self)


_YAML11_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _convert(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
        if value is None:
            return None
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {type(value).__name__}")
        (item,) = typing.get_args(hint)
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}")
        return dict(value)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
            raise ConfigError(
                f"{where} must be one of {', '.join(map(str, choices))}, got {value!r}",
                hint=f"did you mean {close[0]!r}?" if close else "",
            )
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if hint in (int, float):
        if isinstance(value, str) and _YAML11_NUMBER.fullmatch(value.strip()):
            value = float(value)  # PyYAML reads 1e-5 (no dot) as a string; users mean the number
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (hint is int and not float(value).is_integer())
        ):
            raise ConfigError(f"{where} must be {'an integer' if hint is int else 'a number'}, got {value!r}")
        return hint(value)
    if hint is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return str(value)
    return value


def _build(cls: type, data: Any, where: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(names)}"
            raise ConfigError(f"unknown config key {path!r}", hint=hint)
        kwargs[key] = _convert(value, hints[key], path)
    return cls(**kwargs)


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Build and validate a TrainConfig from plain data (as parsed from YAML)."""
    return _build(TrainConfig, data, "").validate()


def load_config(path: str | Path) -> TrainConfig:
    """Read a YAML file into a validated TrainConfig."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"config file {str(path)!r} not found", hint="pass the path of a YAML file, e.g. configs/ci-tiny.yaml"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    config = config_from_dict(data or {})
    config.imports = [resolve_target(t, base=path.parent) for t in config.imports]
    return config


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """Plain-data form of a config (saved next to checkpoints)."""
    return dataclasses.asdict(config)
