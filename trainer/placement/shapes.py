"""A model's architecture as numbers: read from its config.json, or from a shipped table of well-known shapes.

The dry-run never downloads: a local directory (or the cached SmolLM2 copy) gives its own config.json; a Hugging
Face id or a path that does not exist here is matched by its last component against `KNOWN_SHAPES` (facts from each
model's published config.json, written as data).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError

SMOLLM2_VOCAB = 49152  # the SmolLM2 tokenizer the "tiny" test model is built over


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama / Qwen2 / Qwen3 family) as the sizes that decide its memory."""

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool
    qkv_bias: bool = False  #: Qwen2 / Qwen2.5 add a bias to q, k and v
    qk_norm: bool = False  #: Qwen3 normalises q and k per head
    max_positions: int = 32768

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention, gated MLP, two RMSNorms."""
        h, q, kv = self.hidden, self.q_width, self.kv_width
        attention = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        return attention + 3 * h * self.intermediate + 2 * h

    def embedding_params(self) -> int:
        """The token embedding plus the output head when it is not tied to it."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def params(self) -> int:
        """Every parameter of the model."""
        return self.embedding_params() + self.layers * self.layer_params() + self.hidden


def _shape(name: str, vocab: int, hidden: int, inter: int, layers: int, heads: int, kv: int, dim: int, **kw: Any):
    return ModelShape(name, vocab, hidden, inter, layers, heads, kv, dim, **kw)


_QWEN25 = {"qkv_bias": True, "max_positions": 32768}
_QWEN3 = {"qk_norm": True, "max_positions": 40960}
#: well-known shapes by lower-case name (an "-instruct" / "-base" suffix shares its base model's shape)
KNOWN_SHAPES: dict[str, ModelShape] = {
    s.name.lower(): s
    for s in (
        _shape("Qwen2.5-0.5B", 151936, 896, 4864, 24, 14, 2, 64, tied_embeddings=True, **_QWEN25),
        _shape("Qwen2.5-1.5B", 151936, 1536, 8960, 28, 12, 2, 128, tied_embeddings=True, **_QWEN25),
        _shape("Qwen2.5-3B", 151936, 2048, 11008, 36, 16, 2, 128, tied_embeddings=True, **_QWEN25),
        _shape("Qwen2.5-7B", 152064, 3584, 18944, 28, 28, 4, 128, tied_embeddings=False, **_QWEN25),
        _shape("Qwen3-0.6B", 151936, 1024, 3072, 28, 16, 8, 128, tied_embeddings=True, **_QWEN3),
        _shape("Qwen3-1.7B", 151936, 2048, 6144, 28, 16, 8, 128, tied_embeddings=True, **_QWEN3),
        _shape("Qwen3-4B", 151936, 2560, 9728, 36, 32, 8, 128, tied_embeddings=True, **_QWEN3),
        _shape("Qwen3-8B", 151936, 4096, 12288, 36, 32, 8, 128, tied_embeddings=False, **_QWEN3),
        _shape("Llama-3.1-8B", 128256, 4096, 14336, 32, 32, 8, 128, tied_embeddings=False, max_positions=131072),
        _shape("SmolLM2-135M", 49152, 576, 1536, 30, 9, 3, 64, tied_embeddings=True, max_positions=8192),
        _shape("SmolLM2-360M", 49152, 960, 2560, 32, 15, 5, 64, tied_embeddings=True, max_positions=8192),
        _shape("SmolLM2-1.7B", 49152, 2048, 8192, 24, 32, 32, 64, tied_embeddings=True, max_positions=8192),
    )
}
_SUFFIXES = ("-instruct", "-base", "-it")


def known_name(name: str) -> str | None:
    """The table key a model name or path matches (`Qwen/Qwen2.5-7B-Instruct` -> `qwen2.5-7b`), or None."""
    key = Path(name.rstrip("/")).name.lower().removeprefix("meta-")
    for suffix in _SUFFIXES:
        key = key.removesuffix(suffix)
    return key if key in KNOWN_SHAPES else None


def shape_from_config(data: dict[str, Any], name: str) -> ModelShape:
    """The shape a Hugging Face config.json describes; ConfigError naming the missing key."""
    data = data.get("text_config") or data  # a multimodal config keeps its language model's sizes inside
    needed = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [key for key in needed if not isinstance(data.get(key), int)]
    if missing:
        raise ConfigError(
            f"{name}: config.json lacks {', '.join(missing)}: not a decoder-only model the dry-run can size",
            hint="the dry-run sizes Llama / Qwen2 / Qwen3-style causal LMs",
        )
    heads = data["num_attention_heads"]
    model_type = str(data.get("model_type", ""))
    return ModelShape(
        name=name,
        vocab=data["vocab_size"],
        hidden=data["hidden_size"],
        intermediate=data["intermediate_size"],
        layers=data["num_hidden_layers"],
        heads=heads,
        kv_heads=data.get("num_key_value_heads") or heads,
        head_dim=data.get("head_dim") or data["hidden_size"] // heads,
        tied_embeddings=bool(data.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(data.get("attention_bias", False)),
        qk_norm=model_type.startswith("qwen3"),
        max_positions=data.get("max_position_embeddings") or 32768,
    )


def tiny_shape(model: Any) -> ModelShape:
    """The random "tiny" test model `trainer.models.tiny_llama` builds for a ModelConfig."""
    return ModelShape(
        name="tiny",
        vocab=SMOLLM2_VOCAB,
        hidden=model.tiny_hidden,
        intermediate=model.tiny_hidden * 2,
        layers=model.tiny_layers,
        heads=model.tiny_heads,
        kv_heads=max(1, model.tiny_heads // 2),
        head_dim=model.tiny_hidden // model.tiny_heads,
        tied_embeddings=False,
        max_positions=2048,
    )


def model_shape(model: Any) -> tuple[ModelShape, str]:
    """(shape, where it came from) for a ModelConfig: tiny, smollm2, a local directory or a well-known name."""
    from envhub.trainer.models import SMOLLM2_NAME, cache_root

    if model.name == "tiny":
        return tiny_shape(model), "the tiny test model's settings"
    if model.name == "smollm2":
        cached = cache_root() / "models" / SMOLLM2_NAME / "config.json"
        if cached.exists():
            return _read(cached, SMOLLM2_NAME), str(cached)
        return replace(KNOWN_SHAPES["smollm2-135m"], name=SMOLLM2_NAME), "envhub's table (bundled SmolLM2)"
    config = Path(model.name).expanduser() / "config.json"
    if config.exists():
        return _read(config, model.name), str(config)
    key = known_name(model.name)
    if key is None:
        known = ", ".join(s.name for s in KNOWN_SHAPES.values())
        raise ConfigError(
            f"cannot size model {model.name!r}: no config.json there and not a model envhub knows the shape of",
            hint=f"point model.name at a local Hugging Face directory, or name one of: {known}",
        )
    return replace(KNOWN_SHAPES[key], name=model.name), f"envhub's table ({KNOWN_SHAPES[key].name})"


def _read(path: Path, name: str) -> ModelShape:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", hint="a Hugging Face model directory's config.json") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object", hint="a Hugging Face model directory's config.json")
    return shape_from_config(data, name)
