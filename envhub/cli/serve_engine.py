"""`envhub serve-engine`: serve a model over SGLang's native HTTP API and its OpenAI-compatible routes."""

from __future__ import annotations

import argparse
import os
from typing import Any


def _cmd_serve_engine(args: argparse.Namespace) -> int:
    from aiohttp import web

    from envhub.errors import EngineError
    from envhub.trainer.engines.local import LocalEngine
    from envhub.trainer.engines.server import create_app
    from envhub.trainer.engines.server_security import API_KEY_ENV, check_bind, default_weights_dir

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, api_key)  # before loading the model: refuse fast
    weights_dirs = args.allow_weights_dir or [default_weights_dir()]
    engine = LocalEngine.from_pretrained(
        args.model,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        kv_cache_mb=args.kv_cache_mb,
    )
    device, dtype = engine.model.device, str(engine.model.dtype).removeprefix("torch.")
    print(
        f"envhub serve-engine: {args.model} on {device} ({dtype}) at http://{args.host}:{args.port}"
        f" (api key {'on' if api_key else 'off'}; weights from {', '.join(map(str, weights_dirs))})",
        flush=True,
    )
    app = create_app(
        engine,
        args.model,
        api_key=api_key,
        weights_dirs=weights_dirs,
        weight_version=args.weight_version,
        served_model_name=args.served_model_name,
        max_body_bytes=args.max_body_mb * 1024 * 1024,
    )
    try:
        web.run_app(app, host=args.host, port=args.port, print=None, handler_cancellation=True)
    except OSError as exc:
        raise EngineError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", hint="pick another --port"
        ) from exc
    return 0


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "serve-engine", help="serve a model over SGLang's native HTTP API (/generate, ...) and /v1 routes"
    )
    p.add_argument(
        "--model", default="smollm2", help="smollm2 (default), tiny (random test model) or a local HF model dir"
    )
    p.add_argument("--host", default="127.0.0.1", help="a non-loopback address needs --api-key")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when present)")
    p.add_argument("--max-batch-size", type=int, default=64, help="most requests decoded together")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="serving dtype (auto: bf16 on CUDA and on CPUs with bf16 units, else fp32)",
    )
    p.add_argument("--kv-cache-mb", type=float, default=2048.0, help="KV cache budget; longer requests are refused")
    p.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` (default: $ENVHUB_ENGINE_API_KEY)"
    )
    p.add_argument(
        "--allow-weights-dir",
        action="append",
        metavar="DIR",
        help="a directory /update_weights_from_disk may load safetensors from (repeatable; "
        "default: $ENVHUB_CACHE/engine-weights)",
    )
    p.add_argument("--weight-version", default="default", help="the initial weight version string (SGLang's default)")
    p.add_argument("--served-model-name", default=None, help="the model id in /v1/models (default: --model)")
    p.add_argument(
        "--max-body-mb", type=int, default=64, help="largest request body accepted (413 above; tensor pushes need room)"
    )
    p.set_defaults(handler=_cmd_serve_engine)
