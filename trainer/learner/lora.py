"""LoRA through peft: adapters are trained, engines get merged full weights, checkpoints hold the adapter."""

from __future__ import annotations

from typing import Any

import torch

from envhub.errors import ConfigError
from envhub.trainer.config import LoraConfig


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError(
            "model.lora needs the peft package", hint="pip install 'envhub[train]' (peft>=0.13)"
        ) from None
    return peft


def apply_lora(model: Any, config: LoraConfig) -> Any:
    """`model` wrapped by peft with trainable adapters on `config.target_modules` (base weights frozen)."""
    peft = _peft()
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    unknown = [m for m in config.target_modules if m not in names]
    if unknown:
        raise ConfigError(
            f"model.lora.target_modules {unknown} are not linear layers of this model",
            hint=f"choose from {', '.join(sorted(names))}",
        )
    lora = peft.LoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, lora)


@torch.no_grad()
def merged_state(model: Any) -> dict[str, torch.Tensor]:
    """The base model's weights with W + scale * B @ A folded in, under the base model's own names."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                delta = module.get_delta_weight(adapter)
                key = f"{name}.base_layer.weight"
                deltas[key] = deltas[key] + delta if key in deltas else delta
    state = {}
    for name, param in base.named_parameters():
        if "lora_" in name:
            continue
        value = param.detach()
        state[name.replace(".base_layer", "")] = value + deltas[name].to(value.dtype) if name in deltas else value
    return state


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """CPU copies of the adapter weights (what a LoRA checkpoint stores)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in _peft().get_peft_model_state_dict(model).items()}


def load_adapter_state(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Load adapter weights strictly: every adapter tensor present, nothing unknown."""
    expected = set(_peft().get_peft_model_state_dict(model))
    missing, unknown = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unknown:
        raise ConfigError(
            f"LoRA checkpoint does not match the model: missing {missing[:3]}, unknown {unknown[:3]}",
            hint="resume with the same model.lora settings the run was started with",
        )
    _peft().set_peft_model_state_dict(model, state)
