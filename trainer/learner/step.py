"""The torch learner: token-budget micro-batches, logprobs recomputed as the engine does, one guarded GRPO step.

Masters and AdamW state are fp32; forward/backward run under bf16 autocast when the config asks for
bf16. A step whose gradient norm is not finite is skipped (counted) so NaN weights never reach an
engine. On the first step the KL between the behaviour logprobs and the learner's recomputation is
checked: a large one means engine and learner disagree about what a logprob is.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from envhub.errors import ConfigError
from envhub.trainer.config import AlgorithmConfig, LearnerConfig, LoraConfig
from envhub.trainer.learner.advantages import loss_stats, masked_mean, sample_advantages
from envhub.trainer.learner.credit import CreditParams, anchor_share, token_advantages, turn_advantages
from envhub.trainer.learner.layers import freeze_below_top_layers
from envhub.trainer.learner.microbatch import (
    MicroBatch,
    TokenLogprobs,
    pad_rows,
    plan_micro_batches,
    prompt_groups,
    shareable_prefix,
)
from envhub.trainer.learner.optimizer import build_optimizer
from envhub.trainer.learner.pg_variants import pg_stat_names, pg_token_loss
from envhub.trainer.learner.precision import (
    Precision,
    cast_state,
    check_fp32_masters,
    export_weights,
    resolve_precision,
)
from envhub.trainer.run.graph_capture import CAPTURE_LOCK
from envhub.trainer.staleness import Staleness
from envhub.trainer.trajectory import Trajectory


class LogprobMismatch(ConfigError):
    """Behaviour logprobs from the engine disagree with the learner's recomputation."""


def sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    loss_mask: torch.Tensor | None = None,
    chunk_tokens: int = 4096,
) -> torch.Tensor:
    """[B, T] logprob of token t given tokens < t, as log_softmax(logits / T) in fp32 (0 at t = 0 and off the mask)."""
    mask = loss_mask if loss_mask is not None else attention_mask
    return TokenLogprobs(model, temperature, chunk_tokens)(input_ids, attention_mask, mask)


def micro_batch(
    trajs: list[Trajectory], advantages: torch.Tensor | list[torch.Tensor], rows: list[int], pad_id: int
) -> MicroBatch:
    """Pad rows `rows` of the step to their own longest length; `advantages` is one per sequence ([B]) or one
    tensor of per-token advantages per sequence (step-level credit)."""
    picked = [trajs[i] for i in rows]
    if isinstance(advantages, torch.Tensor):
        picked_advantages = advantages[rows]
    else:
        picked_advantages = torch.nn.utils.rnn.pad_sequence([advantages[i] for i in rows], batch_first=True)
    return MicroBatch(
        rows=rows,
        input_ids=pad_rows([t.input_ids for t in picked], pad_id, torch.long),
        attention_mask=pad_rows([[1] * len(t.input_ids) for t in picked], 0, torch.long),
        loss_mask=pad_rows([t.loss_mask for t in picked], 0, torch.float32),
        behavior_logprobs=pad_rows([t.behavior_logprobs for t in picked], 0.0, torch.float32),
        versions=pad_rows([t.versions for t in picked], -1, torch.long),
        advantages=picked_advantages,
    )


@dataclass
class LearnerState:
    """What a checkpoint needs from the learner: full (unsharded) tensors on CPU."""

    model: dict[str, torch.Tensor]  #: full weights, or only the LoRA adapter's
    optimizer: dict[str, Any]
    extra: dict[str, Any]  #: schedule position and counters (JSON)
    adapter_only: bool


class Learner:
    """Owns the trained model and its AdamW optimizer; `step` applies one GRPO update."""

    def __init__(
        self,
        model: Any,
        config: AlgorithmConfig,
        temperature: float,
        pad_id: int,
        *,
        precision: Precision | None = None,
        learner_config: LearnerConfig | None = None,
        lora: LoraConfig | None = None,
        total_steps: int = 0,
        dist: Any = None,
    ) -> None:
        self.config = config
        self.staleness = Staleness.from_config(config)
        self.learner_config = learner_config or LearnerConfig()
        self.temperature = temperature
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.precision = precision or Precision(self.device, torch.float32, next(model.parameters()).dtype)
        check_fp32_masters(model)
        self.reference = None
        if config.kl_coef > 0:
            reference = copy.deepcopy(model).eval().requires_grad_(False)
            self.reference = TokenLogprobs(reference, temperature, share_prefix=self.learner_config.share_prefix)
        if lora is not None and lora.r > 0:
            from envhub.trainer.learner.lora import apply_lora

            model = apply_lora(model, lora)
        freeze_below_top_layers(model, self.learner_config.train_layers)
        if self.learner_config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = model
        self.dist = dist
        # one process (FSDP/DDP see one plain forward), and the KV cache the prefix pass needs (checkpointing drops it)
        lcfg = self.learner_config
        share = lcfg.share_prefix and dist is None and not lcfg.gradient_checkpointing
        scorer = TokenLogprobs(model, temperature, self.learner_config.logprob_chunk_tokens, share_prefix=share)
        self.scorer = dist.wrap(scorer) if dist is not None else scorer
        self.scorer_shares = share  #: micro-batches keep a group's rows together (they share its prompt)
        self.optimizer, self.scheduler = build_optimizer(self.scorer.parameters(), config, total_steps)
        self.steps = 0
        self.skipped_steps = 0
        self.kl_checked = False  # the logprob convention check runs on this process's first step
        self.credit = CreditParams.from_config(config)

    @classmethod
    def from_config(cls, config: Any, model: Any, tokenizer: Any, dist: Any = None) -> Learner:
        """The learner a TrainConfig describes (every learner process builds it the same way)."""
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(
            model,
            config.algorithm,
            config.rollout.temperature,
            pad_id,
            precision=resolve_precision(config.model.device, config.model.dtype),
            learner_config=config.learner,
            lora=config.model.lora,
            total_steps=config.budget.steps,
            dist=dist,
        )

    @property
    def sharded(self) -> bool:
        """True when FSDP shards the weights over the learner processes."""
        return self.dist is not None and self.dist.strategy == "fsdp"

    @property
    def is_lora(self) -> bool:
        """True when only LoRA adapters are trained."""
        return hasattr(self.model, "peft_config")

    def step(self, groups: list[list[Trajectory]], version: int = 0) -> dict[str, float]:
        """One optimizer step on `groups` while the engine serves `version`; stale tokens are weighed per token."""
        if self.dist is not None:
            self.dist.command("step", groups, version)
        return self.local_step(groups, version)

    def local_step(self, groups: list[list[Trajectory]], version: int) -> dict[str, float]:
        """This process's share of a step (every learner process runs it on the same groups)."""
        started = time.monotonic()
        batches, stale_tokens = self._micro_batches(groups, version)
        share, turns = anchor_share(groups)
        sums, total_tokens = self._backward(batches)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.scorer.parameters(), self.config.grad_clip)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        self._check_first_kl(float(sums[2]))
        skipped = self._apply(grad_norm)
        return {
            "loss": float(sums[0]),
            "grad_norm": grad_norm,
            "clip_fraction": float(sums[1]),
            "kl_behavior": float(sums[2]),
            "mean_ratio": float(sums[3]),
            "tokens": total_tokens,
            "padded_tokens": float(sum(mb.padded_tokens for mb in batches)),
            "shared_prefix_tokens": float(sum(self._shared_tokens(mb) for mb in batches)),
            "micro_batches": float(len(batches)),
            "stale_tokens": float(stale_tokens),
            "lr": float(self.scheduler.get_last_lr()[0]),
            "step_skipped": float(skipped),
            "skipped_steps": float(self.skipped_steps),
            "learner_s": time.monotonic() - started,
            "anchor_share": share,
            "turns": float(turns),
            **{name: float(sums[5 + i]) for i, name in enumerate(pg_stat_names(self.config))},
        }

    def gradient(self, groups: list[list[Trajectory]], version: int = 0) -> torch.Tensor:
        """The gradient a step on `groups` would apply, before clipping, flattened over the trained parameters (fp32);
        nothing is applied and the optimizer is untouched. For measuring the gradient's noise
        (benchmarks/gradient_noise.py); one learner process only."""
        if self.dist is not None:
            raise ConfigError(
                "Learner.gradient reads this process's gradients, and the learner runs on several processes",
                hint="measure gradients with one learner process (learner.devices: 1)",
            )
        batches, _ = self._micro_batches(groups, version)
        self._backward(batches)
        flat = self.flat_grad()
        self.optimizer.zero_grad(set_to_none=True)
        self.scorer.eval()
        return flat

    def flat_grad(self) -> torch.Tensor:
        """The trained parameters' gradients as they stand, flattened in parameter order (fp32; zeros for a parameter
        without one): the layout of `gradient`, for any other gradient a benchmark compares with it."""
        trained = [p for p in self.scorer.parameters() if p.requires_grad]
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in trained])

    def _shared_tokens(self, mb: MicroBatch) -> int:
        """Tokens of `mb` that a shared prefix spared the forward pass (`learner.share_prefix`)."""
        if not self.scorer_shares:
            return 0
        return (mb.input_ids.shape[0] - 1) * shareable_prefix(mb.input_ids, mb.attention_mask)

    def _micro_batches(self, groups: list[list[Trajectory]], version: int) -> tuple[list[MicroBatch], int]:
        """The step's token-budget micro-batches, with group advantages and each token's staleness applied."""
        cfg = self.config
        trajs = [t for g in groups for t in g]
        advantages: torch.Tensor | list[torch.Tensor]
        if cfg.advantage == "grpo":  # per episode, handed to each of its samples (a split harness episode's calls)
            advantages = torch.cat(
                [sample_advantages(g, scale_std=cfg.scale_std, tol=cfg.zero_variance_tol) for g in groups]
            )
        else:  # per-token: each turn its own advantage (trainer/learner/credit.py)
            advantages = [
                token_advantages(t, per) for g in groups for t, per in zip(g, turn_advantages(g, self.credit))
            ]
        lengths = [len(t.input_ids) for t in trajs]
        groups_of_rows = prompt_groups([[t.input_ids for t in g] for g in groups]) if self.scorer_shares else None
        plan = plan_micro_batches(lengths, cfg.max_tokens_per_micro_batch, cfg.micro_batch_size, groups_of_rows)
        batches = [micro_batch(trajs, advantages, rows, self.pad_id) for rows in plan]
        stale_tokens = 0
        for mb in batches:
            stale = self.staleness.stale_tokens(mb.versions, mb.loss_mask, version)
            stale_tokens += int(stale.sum())
            if self.staleness.mode == "drop":
                mb.loss_mask = mb.loss_mask.masked_fill(stale, 0.0)
                stale = torch.zeros_like(stale)
            mb.stale = stale
        return batches, stale_tokens

    def _backward(self, batches: list[MicroBatch]) -> tuple[torch.Tensor, float]:
        """Gradients of this process's micro-batches, each token weighed by the step's model tokens (a token mean over
        the whole step); returns the token-weighted sums of the step's diagnostics, and those tokens."""
        total_tokens = sum(float(mb.loss_mask.sum()) for mb in batches) or 1.0
        world, rank = (self.dist.world, self.dist.rank) if self.dist is not None else (1, 0)
        mine = batches[rank::world]
        count = -(-len(batches) // world)
        weights = [1.0] * len(mine) + [0.0] * (count - len(mine))
        mine += [batches[-1]] * (count - len(mine))  # equal backward counts on every process; padding rows weigh 0
        self.scorer.train()
        self.optimizer.zero_grad(set_to_none=True)
        # loss, clip fraction, kl, ratio, model tokens, then the variant's and IS correction's diagnostics
        sums = torch.zeros(5 + len(pg_stat_names(self.config)), dtype=torch.float64)
        for i, (mb, weight) in enumerate(zip(mine, weights)):
            with self._sync(i == count - 1), CAPTURE_LOCK:  # no CUDA graph capture meanwhile: graph_capture.py
                sums += self._micro_step(mb, weight, total_tokens, world)
        return (self.dist.all_reduce(sums) if self.dist is not None else sums), total_tokens

    def _check_first_kl(self, kl: float) -> None:
        """On this process's first step, refuse to train when engine and learner disagree about logprobs."""
        first, self.kl_checked = not self.kl_checked, True
        if first and self.config.max_initial_kl > 0 and kl > self.config.max_initial_kl:
            self.optimizer.zero_grad(set_to_none=True)
            raise LogprobMismatch(
                f"first learner step: KL(behaviour || learner) = {kl:.4f} > algorithm.max_initial_kl = "
                f"{self.config.max_initial_kl}; the engine's logprobs are not the learner's "
                f"log_softmax(logits / {self.temperature})",
                hint="likely causes: a different temperature convention, a server returning logprobs before "
                "temperature scaling, or a dtype mismatch between engine and learner",
            )

    def _apply(self, grad_norm: float) -> bool:
        """The optimizer step, skipped (and counted) when the gradient is not finite; True when skipped."""
        skipped = not torch.isfinite(torch.tensor(grad_norm))
        if skipped:  # a NaN/inf gradient would poison the weights and then the engine
            self.skipped_steps += 1
        else:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scorer.eval()
        self.steps += 1
        return skipped

    def _sync(self, last: bool) -> Any:
        import contextlib

        return self.dist.sync(self.scorer, last) if self.dist is not None else contextlib.nullcontext()

    def _micro_step(self, mb: MicroBatch, weight: float, total_tokens: float, world: int) -> torch.Tensor:
        """Forward/backward of one micro-batch; returns its token-weighted diagnostics."""
        cfg = self.config
        dev = self.precision.device
        ids, attn = mb.input_ids.to(dev), mb.attention_mask.to(dev)
        mask, behavior = mb.loss_mask.to(dev), mb.behavior_logprobs.to(dev)
        stale = mb.stale.to(dev) if mb.stale is not None else torch.zeros_like(mask, dtype=torch.bool)
        with self.precision.autocast():
            logprobs = self.scorer(ids, attn, mask)
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = self.reference(ids, attn, mask)
        per_token, stats = pg_token_loss(
            logprobs, behavior, mb.advantages.to(dev), mask, cfg, stale=stale, ref_logprobs=ref
        )
        loss = masked_mean(per_token, mask)
        share = float(mask.sum()) / total_tokens * weight  # token mean over the whole step, not per micro-batch
        if loss.requires_grad:
            (loss * share * world).backward()  # DDP / FSDP average gradients over processes: undo it
        clip = loss_stats(logprobs.detach(), behavior, mask, cfg.clip_low, cfg.clip_high)
        diagnostics = [float(loss.detach()), clip.clip_fraction, clip.approx_kl, clip.mean_ratio]
        diagnostics = [x * share for x in diagnostics] + [float(mask.sum()) * weight]
        diagnostics += [stats[name] * share for name in pg_stat_names(cfg)]  # the variant's and IS correction's
        return torch.tensor(diagnostics, dtype=torch.float64)

    def engine_state(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Full weights for an engine in `dtype` (default: the engine dtype); LoRA adapters merged in."""
        if self.dist is not None and self.dist.strategy == "fsdp":  # gathering shards needs every process
            self.dist.command("engine_state", dtype)
        return self.local_engine_state(dtype)

    def local_engine_state(self, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
        """This process's part of `engine_state` (a collective under FSDP)."""
        dtype = dtype or self.precision.engine_dtype
        if self.is_lora:
            from envhub.trainer.learner.lora import merged_state

            return cast_state(merged_state(self.model), dtype)
        if self.dist is not None:
            names = {name for name, _ in self.model.named_parameters()}  # tied weights once, as below
            state = {k: v for k, v in self.dist.full_model_state(self.model).items() if k in names}
        else:  # named_parameters lists tied weights once (state_dict would repeat lm_head under its own name)
            state = {name: p for name, p in self.model.named_parameters()}
        return cast_state(state, dtype)

    def export_engine_weights(self, path: Path, state: dict[str, torch.Tensor]) -> None:
        """Save `state` (from `engine_state`) as a Hugging Face directory in the engine dtype, for a server to load."""
        export_weights(self.hf_model(), path, self.precision.engine_dtype, state)

    def hf_model(self) -> Any:
        """The Hugging Face model (config, save_pretrained) under LoRA / FSDP wrappers."""
        return self.model.get_base_model() if self.is_lora else self.model

    def checkpoint_state(self) -> LearnerState:
        """Full CPU copies of what a checkpoint holds (a collective under FSDP)."""
        if self.dist is not None and self.dist.strategy == "fsdp":
            self.dist.command("checkpoint_state")
        return self.local_checkpoint_state()

    def local_checkpoint_state(self) -> LearnerState:
        """This process's part of `checkpoint_state`."""
        extra = {"scheduler": self.scheduler.state_dict(), "steps": self.steps, "skipped_steps": self.skipped_steps}
        if self.is_lora:
            from envhub.trainer.learner.lora import adapter_state

            model_state = adapter_state(self.model)
        elif self.dist is not None:
            model_state = self.dist.full_model_state(self.model)
        else:
            model_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        optimizer = (
            self.dist.full_optimizer_state(self.model, self.optimizer)
            if self.dist is not None
            else copy.deepcopy(self.optimizer.state_dict())
        )
        return LearnerState(model=model_state, optimizer=optimizer, extra=extra, adapter_only=self.is_lora)

    def load_sharded_checkpoint(self, path: Any) -> None:
        """FSDP resume from a checkpoint directory (full HF weights + torch.optim state), strictly."""
        from envhub.trainer.learner.checkpoint import read_weights, set_rng_state

        state = read_weights(path)
        missing = sorted({name for name, _ in self.model.named_parameters()} - set(state))
        if missing:
            raise ConfigError(
                f"checkpoint {path} lacks {missing[:3]} ({len(missing)})",
                hint="resume with the model the run was started with",
            )
        self.load_sharded(state, torch.load(path / "optimizer.pt", weights_only=False))
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))

    def load_sharded(self, model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any]) -> None:
        """FSDP resume: rank 0's full checkpoint tensors are broadcast and every process keeps its shards."""
        self.dist.command("load_sharded", {}, {})
        self.local_load_sharded(model_state, optimizer_state)

    def local_load_sharded(self, model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any]) -> None:
        """This process's part of `load_sharded` (followers pass empty dicts)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.model, model_state, options=options)
        if optimizer_state:  # torch.optim's positional keys -> parameter names, the optimizer's own order
            names = [name for name, p in self.model.named_parameters() if p.requires_grad]
            optimizer_state = {
                "state": {names[int(i)]: v for i, v in optimizer_state["state"].items()},
                "param_groups": [
                    {**g, "params": [names[int(i)] for i in g["params"]]} for g in optimizer_state["param_groups"]
                ],
            }
        set_optimizer_state_dict(self.model, self.optimizer, optimizer_state, options=options)

    def broadcast_state(self) -> None:
        """After rank 0 loaded a checkpoint: every learner process takes its weights, optimizer and schedule."""
        if self.dist is not None:
            self.dist.command("broadcast_state")
            self.local_broadcast_state()

    def local_broadcast_state(self) -> None:
        """This process's part of `broadcast_state` (weights and optimizer only under DDP: FSDP loaded shards)."""
        import torch.distributed as torch_dist

        replicated = self.dist.strategy == "ddp"
        if replicated:
            with torch.no_grad():
                for tensor in self.model.state_dict().values():
                    torch_dist.broadcast(tensor, src=0)
        state = (
            self.optimizer.state_dict() if replicated else None,
            self.scheduler.state_dict(),
            self.steps,
            self.skipped_steps,
        )
        payload = [state] if self.dist.rank == 0 else [None]
        torch_dist.broadcast_object_list(payload, src=0)
        if self.dist.rank > 0:
            optimizer, scheduler, self.steps, self.skipped_steps = payload[0]
            if optimizer is not None:
                self.optimizer.load_state_dict(optimizer)
            self.scheduler.load_state_dict(scheduler)

    def load_extra_state(self, extra: dict[str, Any]) -> None:
        """Restore the schedule position and counters saved by `checkpoint_state`."""
        if "scheduler" in extra:
            self.scheduler.load_state_dict(extra["scheduler"])
        self.steps = int(extra.get("steps", self.steps))
        self.skipped_steps = int(extra.get("skipped_steps", 0))
