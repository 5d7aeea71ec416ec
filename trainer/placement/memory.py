"""Memory arithmetic from a model's shape: learner (weights, gradients, Adam, activations, logits) and KV cache.

The learner keeps fp32 master weights, fp32 gradients of what it trains and two fp32 Adam moments per trained
weight (`learner/precision.py`); forward and backward run under autocast in the compute dtype. Per decoder layer
and token, the backward pass keeps (bytes, c = compute dtype size, H hidden, Q = heads x head_dim, I intermediate):

    16 H            two RMSNorms: fp32 input and normalised output each (the residual stream stays fp32)
    c (H + 4 Q)     attention: the projections' input, rotated q, k and v repeated to every head (GQA), output
    c (H + 4 I)     gated MLP: its input, gate, up, act(gate) and the product fed to down_proj

Under bf16 autocast each weight's bf16 cast is also kept from its forward to its backward (2 bytes a weight).
With gradient checkpointing a layer keeps only its fp32 input (4 H) and one layer is recomputed at a time, after the
logits are freed. The vocabulary projection runs `logprob_chunk_tokens` rows at a time: a chunk's logits, their fp32
copy, the softmax temporaries and the gradient, ~16 bytes per (row, vocabulary entry). docs/gpu.md compares this with
`benchmarks/learner_memory.py`'s measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envhub.trainer.placement.shapes import ModelShape

GIB = 2**30
LOGITS_BYTES = 16  # per row and vocabulary entry of one logprob chunk (module docstring)
GPU_CONTEXT = GIB // 2  # CUDA context + kernels of one process on one GPU (not counted by the torch allocator)
PROCESS_HOST = 2 * GIB  # a Python process with torch and transformers imported, before any model
#: the Linear layers LoRA can adapt: (input width, output width) as functions of the shape
_LORA_WIDTHS = {
    "q_proj": lambda s: (s.hidden, s.q_width),
    "k_proj": lambda s: (s.hidden, s.kv_width),
    "v_proj": lambda s: (s.hidden, s.kv_width),
    "o_proj": lambda s: (s.q_width, s.hidden),
    "gate_proj": lambda s: (s.hidden, s.intermediate),
    "up_proj": lambda s: (s.hidden, s.intermediate),
    "down_proj": lambda s: (s.intermediate, s.hidden),
}


@dataclass(frozen=True)
class LearnerSettings:
    """What of a run's config decides the learner's memory."""

    compute_bytes: int = 2  #: 2 = bf16 autocast, 4 = fp32
    devices: int = 1
    fsdp: bool = False  #: shard weights, gradients and Adam states over `devices`
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    train_layers: int = 0  #: 0 = every weight
    checkpointing: bool = False
    micro_batch_tokens: int = 16384  #: padded tokens of the largest micro-batch
    logprob_chunk: int = 2048
    reference: bool = False  #: a full fp32 copy for the KL term (algorithm.kl_coef > 0)
    push_bytes: int = 2  #: dtype size of the weights pushed to engines (a full copy made at each push)


@dataclass
class LearnerMemory:
    """Bytes one learner process holds on its device, by kind; `peak` is the most at one time."""

    parts: dict[str, int] = field(default_factory=dict)
    load: int = 0  #: while loading: the full fp32 model on the device before FSDP shards it
    peak: int = 0
    trainable: int = 0  #: trained parameters (LoRA adapters, the top layers, or all)


def lora_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters: rank x (in + out) per adapted Linear, in every layer."""
    unknown = [t for t in targets if t not in _LORA_WIDTHS]
    if unknown:
        from envhub.errors import ConfigError

        raise ConfigError(
            f"model.lora.target_modules {unknown} are not Linear layers of a {shape.name} decoder",
            hint=f"choose from {', '.join(_LORA_WIDTHS)}",
        )
    return shape.layers * sum(rank * sum(_LORA_WIDTHS[t](shape)) for t in targets)


def trainable_params(shape: ModelShape, s: LearnerSettings) -> int:
    """Parameters that get gradients and Adam states."""
    if s.lora_rank > 0:
        return lora_params(shape, s.lora_rank, s.lora_targets)
    if s.train_layers > 0:
        return min(s.train_layers, shape.layers) * shape.layer_params() + shape.hidden
    return shape.params()


def layer_activation_bytes(shape: ModelShape, compute_bytes: int) -> int:
    """Bytes one decoder layer keeps per token for backward (module docstring)."""
    h, q, i = shape.hidden, shape.q_width, shape.intermediate
    return 16 * h + compute_bytes * (h + 4 * q) + compute_bytes * (h + 4 * i)


def activation_bytes(shape: ModelShape, s: LearnerSettings) -> int:
    """Activations of the largest micro-batch kept for backward (embedding output and final norm included)."""
    per_layer = layer_activation_bytes(shape, s.compute_bytes)
    if s.train_layers > 0 and s.lora_rank == 0:
        layers = min(s.train_layers, shape.layers)  # backward stops at the lowest trained layer
    else:
        layers = shape.layers
    per_token = 4 * shape.hidden * layers if s.checkpointing else per_layer * layers
    return s.micro_batch_tokens * (per_token + 12 * shape.hidden)


def recompute_bytes(shape: ModelShape, s: LearnerSettings) -> int:
    """With gradient checkpointing: the one layer recomputed in backward (after the logits are freed)."""
    return s.micro_batch_tokens * layer_activation_bytes(shape, s.compute_bytes) if s.checkpointing else 0


def logits_bytes(shape: ModelShape, s: LearnerSettings) -> int:
    """The vocabulary projection of one logprob chunk, forward and backward."""
    return min(s.logprob_chunk, s.micro_batch_tokens) * shape.vocab * LOGITS_BYTES


def learner_memory(shape: ModelShape, s: LearnerSettings) -> LearnerMemory:
    """What one learner process holds on its device during a step, and at load and push time."""
    total = shape.params()
    trainable = trainable_params(shape, s)
    share = s.devices if s.fsdp else 1
    base = total + (trainable if s.lora_rank > 0 else 0)  # adapters are extra weights beside the frozen base
    parts = {
        "weights (fp32 masters)": 4 * base // share,
        "gradients (fp32)": 4 * trainable // share,
        "Adam states (2 x fp32)": 8 * trainable // share,
    }
    if s.reference:
        parts["KL reference (fp32 copy)"] = 4 * total
    steady = sum(parts.values())
    parts["activations"] = activation_bytes(shape, s)
    parts["logits chunk"] = logits_bytes(shape, s)
    if s.checkpointing:
        parts["recomputed layer"] = recompute_bytes(shape, s)
    transient = max(parts["logits chunk"], parts.get("recomputed layer", 0))  # one after the other in backward
    step = parts["activations"] + transient
    if s.compute_bytes == 2:  # autocast keeps a bf16 cast of every weight from forward until its backward
        parts["bf16 weight casts (autocast)"] = 2 * base // share
        step += parts["bf16 weight casts (autocast)"]
    if s.fsdp and s.devices > 1:  # the root's embedding / head and two layers unsharded at a time
        parts["FSDP gathered weights"] = 4 * (shape.embedding_params() + 2 * shape.layer_params())
        step += parts["FSDP gathered weights"]
    push = s.push_bytes * total  # engine_state: the whole model cast for the engines (LoRA merged, FSDP gathered)
    parts["weight push copy"] = push
    load = 4 * total + (4 * total if s.reference else 0)
    return LearnerMemory(parts=parts, load=load, peak=max(steady + max(step, push), load), trainable=trainable)


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int, tp: int = 1) -> int:
    """KV cache bytes per token on one GPU: keys and values, every layer, this GPU's kv heads."""
    kv_heads = max(1, -(-shape.kv_heads // tp))  # servers replicate kv heads when tp exceeds them
    return 2 * shape.layers * kv_heads * shape.head_dim * dtype_bytes


def weight_bytes(shape: ModelShape, dtype_bytes: int, tp: int = 1) -> int:
    """An engine's copy of the weights on one of its `tp` GPUs."""
    return shape.params() * dtype_bytes // tp


def gib(n: float) -> float:
    """Bytes as GiB, rounded for printing."""
    return round(n / GIB, 2)
