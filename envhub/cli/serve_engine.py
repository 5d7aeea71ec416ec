"""`envhub serve-engine`: serve a model with an engine kind in the foreground: the embedded engine over SGLang's
native HTTP API and its OpenAI-compatible routes (`--backend embedded`, alias `local`), a real vLLM
OpenAI-compatible server (`--backend vllm`), or a kind a `--import` module registers. Each kind serves itself
(`EngineKind.serve`); this module only declares the options."""

from __future__ import annotations

import argparse
from typing import Any

from envhub.cli.imports import add_import_option


def _cmd_serve_engine(args: argparse.Namespace) -> int:
    from envhub.trainer.engines import engine_kind

    return engine_kind(args.backend).serve(args)


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "serve-engine", help="serve a model over SGLang's native HTTP API (/generate, ...) and /v1 routes"
    )
    p.add_argument(
        "--model", default="smollm2", help="smollm2 (default), tiny (random test model) or a local HF model dir"
    )
    p.add_argument(
        "--backend",
        default="embedded",
        metavar="KIND",
        help="embedded (default; alias local): the embedded engine behind SGLang's API; vllm: a real vLLM server "
        "(make install sets it up); or an engine kind that a --import module registers",
    )
    p.add_argument("--host", default="127.0.0.1", help="a non-loopback address needs --api-key")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when present; embedded backend)")
    p.add_argument("--max-batch-size", type=int, default=None, help="most requests decoded together (default 64)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="weights and compute (auto: the embedded engine takes bf16 on CUDA and CPUs with bf16 units, else fp32; "
        "vllm takes fp32)",
    )
    p.add_argument(
        "--kv-cache-mb",
        type=float,
        default=2048.0,
        help="embedded backend: KV cache budget; longer requests refused",
    )
    p.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` (default: $ENVHUB_ENGINE_API_KEY)"
    )
    p.add_argument(
        "--allow-weights-dir",
        action="append",
        metavar="DIR",
        help="a directory /update_weights_from_disk may load safetensors from (repeatable; "
        "default: $ENVHUB_CACHE/engine-weights; embedded backend)",
    )
    p.add_argument("--weight-version", default="default", help="the initial weight version string (SGLang's default)")
    p.add_argument("--served-model-name", default=None, help="the model id in /v1/models (default: --model)")
    p.add_argument(
        "--max-body-mb",
        type=int,
        default=None,
        help="largest request body accepted (default 64; 413 above; tensor pushes need room; embedded backend)",
    )
    vllm = p.add_argument_group("--backend vllm")
    vllm.add_argument("--max-model-len", type=int, default=2048, help="context length (prompt + completion)")
    vllm.add_argument("--kv-cache-gib", type=float, default=2.0, help="KV cache memory (VLLM_CPU_KVCACHE_SPACE)")
    vllm.add_argument(
        "--rl-routes",
        action="store_true",
        help="also serve vLLM's RL routes (/pause, /collective_rpc, ...) for `engine: {kind: vllm, url: ...}`; "
        "they have no authentication, so loopback only",
    )
    vllm.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for the server")
    add_import_option(p)  # a module that registers an engine kind (or envs)
    p.set_defaults(handler=_cmd_serve_engine)
