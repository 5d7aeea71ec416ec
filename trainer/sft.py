"""SFT warm start: fine-tune on chat-format trajectories (from `envhub collect`) before RL, loss on assistant tokens
only.

Each conversation is laid out with the rollout's own incremental chat-template code (`ChatTokens`), so the
tokens, and which of them carry loss, are exactly those a rollout of the same conversation would produce:
the assistant's text and its end-of-turn token have loss mask 1; system, user/env messages, generation
prompts and the template's closing newline have mask 0.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from envhub.chat_tokens import ChatTokens
from envhub.errors import ConfigError
from envhub.trainer.engines.embedded.threads import apply_threads
from envhub.trainer.learner.layers import freeze_below_top_layers
from envhub.trainer.learner.precision import resolve_precision

if TYPE_CHECKING:
    from envhub.trainer.run.cores import CoreShare


@dataclass
class SFTExample:
    """One conversation as token ids with the loss mask of the rollout's layout."""

    input_ids: list[int]
    loss_mask: list[int]
    env: str = ""


def layout(messages: list[dict[str, str]], tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> SFTExample:
    """Token ids and loss mask of a conversation, built turn by turn as `RolloutWorker` builds them."""
    chat = ChatTokens(tokenizer, tools=tools)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stop = end if isinstance(end, int) and end >= 0 else tokenizer.eos_token_id
    ids: list[int] = []
    mask: list[int] = []
    pending: list[dict[str, str]] = []
    for message in messages:
        if message["role"] != "assistant":
            pending.append({"role": message["role"], "content": message["content"]})
            continue
        if not pending:
            raise ConfigError(
                "an assistant message must follow a system/user message", hint="check the JSONL conversation order"
            )
        prompt = chat.add_messages(pending)
        pending = []
        ids += prompt
        mask += [0] * len(prompt)
        output = chat.encode(message["content"]) + [stop]
        _, closing = chat.add_assistant(output, {stop})
        ids += output + closing
        mask += [1] * len(output) + [0] * len(closing)
    return SFTExample(ids, mask)


def load_examples(path: str | Path, tokenizer: Any, max_tokens: int = 2048) -> list[SFTExample]:
    """Read chat-format JSONL (`messages`, optional `tools`) into examples, cut to `max_tokens`."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"SFT data {str(path)!r} not found", hint="make it with `envhub collect ENV --agent expert -n N --out FILE`"
        )
    examples = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            messages = record["messages"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{path}:{number} is not a chat record ({type(exc).__name__}: {exc})",
                hint='each line needs {"messages": [{"role": ..., "content": ...}, ...]}',
            ) from None
        example = layout(messages, tokenizer, record.get("tools") or None)
        example.env = str(record.get("env", ""))
        example.input_ids, example.loss_mask = example.input_ids[:max_tokens], example.loss_mask[:max_tokens]
        if sum(example.loss_mask):
            examples.append(example)
    if not examples:
        raise ConfigError(f"{path} has no conversation with an assistant turn")
    return examples


def sft_loss(model: Any, examples: list[SFTExample], pad_id: int) -> torch.Tensor:
    """Mean cross-entropy over the assistant tokens of a (right-padded) batch."""
    device = next(model.parameters()).device
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.float32)
    for row, e in enumerate(examples):
        ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids)
        attention[row, : len(e.input_ids)] = 1
        mask[row, : len(e.loss_mask)] = torch.tensor(e.loss_mask, dtype=torch.float32)
    ids, attention, mask = ids.to(device), attention.to(device), mask.to(device)
    where = mask[:, 1:].bool()
    base = getattr(model, model.base_model_prefix, None)
    if base is None:  # no separate trunk: project every position
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1][where].float()
    else:  # project to the vocabulary only where the loss is taken (most tokens are prompt and env text)
        hidden = base(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1]
        logits = model.get_output_embeddings()(hidden[where]).float()
    return torch.nn.functional.cross_entropy(logits, ids[:, 1:][where])


def run_sft(
    model: Any,
    examples: list[SFTExample],
    *,
    epochs: int = 1,
    lr: float = 1e-5,
    batch_size: int = 4,
    pad_id: int = 0,
    seed: int = 0,
    max_time_s: float = 0.0,
    train_layers: int = 0,
    threads: Callable[[], int] | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> dict[str, float]:
    """Fine-tune `model` in place; returns first/last batch loss, steps and seconds.

    `threads` (the run's `CoreShare.alone`) gives the torch threads of each step, re-read before every step.
    `autocast` wraps each forward pass: the run's `Precision.autocast` (bf16 compute on fp32 masters, as the RL
    learner computes), or nothing (the model's own dtype).

    With `train_layers`, only the top layers learn: the backward pass stops there, which on a CPU roughly halves
    a step's cost (the lower layers and the tied embeddings keep their weights).
    """
    frozen = freeze_below_top_layers(model, train_layers)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    model.train()
    started, losses, steps = time.monotonic(), [], 0
    try:
        for _ in range(epochs):
            order = list(examples)
            rng.shuffle(order)
            for i in range(0, len(order), batch_size):
                if max_time_s and time.monotonic() - started > max_time_s:
                    break
                if threads is not None:
                    apply_threads(threads())
                with autocast():
                    loss = sft_loss(model, order[i : i + batch_size], pad_id)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                losses.append(float(loss.detach()))
                steps += 1
    finally:
        for p in frozen:  # RL trains every weight again
            p.requires_grad_(True)
        model.eval()
    return {
        "steps": steps,
        "first_loss": losses[0] if losses else 0.0,
        "last_loss": losses[-1] if losses else 0.0,
        "examples": len(examples),
        "seconds": time.monotonic() - started,
    }


async def warm_start(
    model: Any, tokenizer: Any, config: Any, out_dir: str | Path, cores: CoreShare | None = None
) -> dict[str, float]:
    """The train config's `sft:` stage: collect expert data if asked, then fine-tune `model` in place (padding with
    the tokenizer's pad token, else its end-of-sequence token); `cores`: the run's rule gives each step's threads
    (`CoreShare.alone`) and the steps' thread its priority (`CoreShare.learner_thread`)."""
    import asyncio

    sft = config.sft
    data = Path(sft.data) if sft.data else Path(out_dir) / "sft.jsonl"
    if sft.collect:
        data = await collect_expert_data(config, data)
    examples = load_examples(data, tokenizer, sft.max_tokens)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    from envhub.trainer.engines.embedded import releasing_openmp

    # on the learner's thread rule: its priority, and its OpenMP workers released at the end as releasing_openmp does
    stats = await asyncio.to_thread(
        releasing_openmp(run_sft) if cores is None else cores.learner_thread()(run_sft),
        model,
        examples,
        epochs=sft.epochs,
        lr=sft.lr,
        batch_size=sft.batch_size,
        pad_id=pad_id,
        seed=config.seed,
        max_time_s=sft.max_time_s,
        train_layers=sft.train_layers,
        threads=cores.alone if cores is not None else None,
        autocast=resolve_precision(config.model.device, config.model.dtype).autocast,
    )
    print(
        f"sft: {stats['steps']} steps on {stats['examples']} conversations, loss {stats['first_loss']:.3f} -> "
        f"{stats['last_loss']:.3f} in {stats['seconds']:.0f}s",
        flush=True,
    )
    return stats


async def collect_expert_data(config: Any, path: Path) -> Path:
    """`sft.collect` solved expert episodes per task (tasks without a solver are skipped) into `path`."""
    from envhub.trainer.collect import collect

    parts = []
    for i, task in enumerate(config.tasks):
        part = path.with_suffix(f".{i}.jsonl")
        try:
            await collect(
                task.env,
                config.sft.collect,
                part,
                seed=2_000_000 + 10_000 * i,
                min_reward=1e-9,
                env_kwargs=task.kwargs,
            )
        except ConfigError as exc:  # e.g. an env without a solver: the others still warm-start
            print(f"sft: no expert data for {task.env}: {exc}", flush=True)
            continue
        parts.append(part)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(p.read_text(encoding="utf-8") for p in parts), encoding="utf-8")
    for part in parts:
        part.unlink()
    return path
