"""`envhub train --dry-run` as text, and the memory table of docs/gpu.md, both from the same arithmetic."""

from __future__ import annotations

from typing import Any

from envhub.trainer.placement.memory import GIB, LearnerSettings, gib, kv_bytes_per_token, learner_memory
from envhub.trainer.placement.placement import Placement
from envhub.trainer.placement.shapes import KNOWN_SHAPES


def _parts(parts: dict[str, int]) -> str:
    return ", ".join(f"{name} {gib(b)}" for name, b in parts.items() if b)


def placement_text(placement: Placement) -> str:
    """The dry-run's report: model, learner strategy, each process and its memory, per-GPU totals, KV, verdict."""
    shape = placement.shape
    lines = [
        f"model {shape.name}: {shape.params() / 1e9:.3f} B parameters ({shape.layers} layers, hidden {shape.hidden}, "
        f"{shape.heads} heads / {shape.kv_heads} kv heads x {shape.head_dim}, vocab {shape.vocab}); "
        f"shape from {placement.shape_source}",
        f"machine: {placement.machine.describe()}",
        f"learner: {placement.strategy}; trains {placement.trainable / 1e6:.1f} M parameters; largest micro-batch "
        f"{placement.micro_batch_tokens} tokens",
        "",
        "process / stage                               where                          GPU GiB (each)   host GiB",
    ]
    previous = None
    for stage in placement.stages:
        gpu = f"{gib(stage.gpu_bytes):>8}" if stage.gpus else "       -"
        host = f"{gib(stage.host_bytes):>8}" if stage.host_bytes else "       -"
        lines.append(f"{stage.name[:44]:<45} {stage.where[:30]:<30} {gpu}         {host}")
        if previous is not None and (stage.parts, stage.detail) == (previous.parts, previous.detail):
            lines.append("    the same as above")
        else:
            lines += [f"    {text}" for text in (_parts(stage.parts), stage.detail) if text]
        previous = stage
    lines.append("")
    machine = placement.machine
    for gpu, users in placement.gpu_use().items():
        need = sum(b for _, b in users)
        of = f" of {gib(machine.gpu_memory)}" if machine.gpu_memory else ""
        lines.append(f"GPU {gpu}: {gib(need)}{of} GiB ({' + '.join(name.split(':')[0] for name, _ in users)})")
    of = f" of {gib(machine.host_memory)}" if machine.host_memory else ""
    lines.append(f"host: {gib(placement.host_use())}{of} GiB")
    for kv in placement.kv:
        lines.append(
            f"KV {kv['engine']}: {kv['bytes_per_token']} bytes/token (layers x kv_heads x head_dim x 2 x "
            f"{kv['dtype_bytes']} bytes{', over tp ' + str(kv['tp']) if kv['tp'] > 1 else ''}); "
            f"{gib(kv['budget_bytes'])} GiB holds {kv['tokens']} tokens; {kv['episodes_in_flight']} episodes in "
            f"flight want up to {kv['tokens_wanted']}"
        )
    lines += [f"note: {n}" for n in placement.notes]
    lines += [f"REFUSED: {r}" for r in placement.refusals]
    lines.append("dry run: refused, nothing started" if placement.refusals else "dry run: ok, nothing started")
    return "\n".join(lines)


def memory_table(tokens: int = 8192, chunk: int = 2048) -> list[dict[str, Any]]:
    """Learner and engine memory of every shipped shape: full fine-tuning and LoRA r=16, bf16, one GPU,
    gradient checkpointing on, `tokens` per micro-batch (docs/gpu.md prints this)."""
    rows = []
    for shape in KNOWN_SHAPES.values():
        full = LearnerSettings(checkpointing=True, micro_batch_tokens=tokens, logprob_chunk=chunk)
        lora = LearnerSettings(checkpointing=True, micro_batch_tokens=tokens, logprob_chunk=chunk, lora_rank=16)
        no_ckpt = LearnerSettings(checkpointing=False, micro_batch_tokens=tokens, logprob_chunk=chunk)
        fsdp8 = LearnerSettings(checkpointing=True, micro_batch_tokens=tokens, logprob_chunk=chunk, devices=8,
                                fsdp=True)  # fmt: skip
        rows.append(
            {
                "model": shape.name,
                "params_b": round(shape.params() / 1e9, 3),
                "bf16_weights_gib": gib(2 * shape.params()),
                "full_gib": gib(learner_memory(shape, full).peak),
                "full_no_checkpointing_gib": gib(learner_memory(shape, no_ckpt).peak),
                "fsdp8_gib": gib(learner_memory(shape, fsdp8).peak),
                "lora16_gib": gib(learner_memory(shape, lora).peak),
                "kv_kib_per_token": round(kv_bytes_per_token(shape, 2) / 1024, 1),
                "kv_tokens_per_gib": GIB // kv_bytes_per_token(shape, 2),
            }
        )
    return rows


def memory_table_markdown(tokens: int = 8192, chunk: int = 2048) -> str:
    """`memory_table` as the Markdown table docs/gpu.md holds."""
    head = (
        "| model | params (B) | bf16 weights | full FT, 1 GPU | full, no ckpt | FSDP over 8 | LoRA r=16 | KV KiB/token "
        "| KV tokens/GiB |\n|---|---|---|---|---|---|---|---|---|"
    )
    rows = [
        f"| {r['model']} | {r['params_b']} | {r['bf16_weights_gib']} | {r['full_gib']} | "
        f"{r['full_no_checkpointing_gib']} | {r['fsdp8_gib']} | {r['lora16_gib']} | {r['kv_kib_per_token']} | "
        f"{r['kv_tokens_per_gib']} |"
        for r in memory_table(tokens, chunk)
    ]
    return "\n".join([head, *rows])
