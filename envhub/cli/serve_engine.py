"""`envhub serve-engine`: serve a model over SGLang's native HTTP API and its OpenAI-compatible routes
(`--backend local`, the embedded engine), or start a real vLLM OpenAI-compatible server (`--backend vllm`)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

_LOCAL_ONLY = ("allow_weights_dir", "device", "max_body_mb")


def _cmd_serve_engine(args: argparse.Namespace) -> int:
    if args.backend == "vllm":
        return _serve_vllm(args)
    from aiohttp import web

    from envhub.errors import EngineError
    from envhub.trainer.engines.embedded.engine import LocalEngine
    from envhub.trainer.engines.server.app import create_app
    from envhub.trainer.engines.server.security import API_KEY_ENV, check_bind, default_weights_dir

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, api_key)  # before loading the model: refuse fast
    weights_dirs = args.allow_weights_dir or [default_weights_dir()]
    engine = LocalEngine.from_pretrained(
        args.model,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size or 64,
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
        max_body_bytes=(args.max_body_mb or 64) * 1024 * 1024,
    )
    try:
        web.run_app(app, host=args.host, port=args.port, print=None, handler_cancellation=True)
    except OSError as exc:
        raise EngineError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", hint="pick another --port"
        ) from exc
    return 0


def _serve_vllm(args: argparse.Namespace) -> int:
    """Run `vllm serve` in the foreground for an envhub model name, with envhub's Hermes tool template."""
    import asyncio

    from envhub.errors import EngineError
    from envhub.trainer.engines.launcher import ManagedServer, module_command
    from envhub.trainer.engines.server.security import API_KEY_ENV, check_bind, is_loopback
    from envhub.trainer.engines.vllm.command import SERVER_MODULE, VLLMServerArgs, vllm_python
    from envhub.trainer.engines.vllm.weights import served_model_dir

    for name in _LOCAL_ONLY:
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise EngineError(f"{flag} is an option of --backend local", hint="drop it for --backend vllm")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or ""
    check_bind(args.host, api_key)
    if args.rl_routes and not is_loopback(args.host):  # vLLM's dev routes ignore --api-key
        raise EngineError(
            f"refusing --rl-routes on {args.host}: vLLM serves /pause, /collective_rpc, ... without authentication",
            hint="bind to 127.0.0.1 for training, or drop --rl-routes",
        )
    python = vllm_python()
    server_args = VLLMServerArgs(
        model=str(served_model_dir(args.model)),
        port=args.port,
        host=args.host,
        served_model_name=args.served_model_name or args.model,
        dtype="float32" if args.dtype == "auto" else args.dtype,
        max_model_len=args.max_model_len,
        kv_cache_gib=args.kv_cache_gib,
        api_key=api_key,
        rl_routes=args.rl_routes,
        tool_template=True,
        max_num_seqs=args.max_batch_size or 0,
    )
    started = time.monotonic()
    command = module_command(python, SERVER_MODULE, server_args.argv())
    server = ManagedServer.start("vllm", command, env=server_args.environment(python), inherit_output=True)
    stopping: list[int] = []

    def stop(signum: int, _frame: Any) -> None:  # Ctrl-C or SIGTERM: stop the whole server group, then return
        stopping.append(signum)
        os.killpg(server.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            asyncio.run(server.wait_ready(f"http://{args.host}:{args.port}/health", args.startup_timeout))
        except EngineError:
            if stopping:
                return 0
            raise
        print(
            f"envhub serve-engine: vLLM serving {args.model} ({server_args.model}, {server_args.dtype}) at "
            f"http://{args.host}:{args.port}/v1 as {server_args.served_model_name!r}, ready in "
            f"{time.monotonic() - started:.0f} s (api key {'on' if api_key else 'off'}; "
            f"RL routes {'on' if args.rl_routes else 'off'})",
            flush=True,
        )
        code = server.process.wait()
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code != 0 and not stopping:
        print(f"envhub serve-engine: the vLLM server exited with code {code}", file=sys.stderr)
        return 1
    return 0


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "serve-engine", help="serve a model over SGLang's native HTTP API (/generate, ...) and /v1 routes"
    )
    p.add_argument(
        "--model", default="smollm2", help="smollm2 (default), tiny (random test model) or a local HF model dir"
    )
    p.add_argument(
        "--backend",
        choices=("local", "vllm"),
        default="local",
        help="local: the embedded engine behind SGLang's API; vllm: a real vLLM server (make install sets it up)",
    )
    p.add_argument("--host", default="127.0.0.1", help="a non-loopback address needs --api-key")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when present; local backend)")
    p.add_argument("--max-batch-size", type=int, default=None, help="most requests decoded together (default 64)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="weights and compute (auto: the local engine takes bf16 on CUDA and on CPUs with bf16 units, else fp32; "
        "vllm takes fp32)",
    )
    p.add_argument(
        "--kv-cache-mb", type=float, default=2048.0, help="local backend: KV cache budget; longer requests are refused"
    )
    p.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` (default: $ENVHUB_ENGINE_API_KEY)"
    )
    p.add_argument(
        "--allow-weights-dir",
        action="append",
        metavar="DIR",
        help="a directory /update_weights_from_disk may load safetensors from (repeatable; "
        "default: $ENVHUB_CACHE/engine-weights; local backend)",
    )
    p.add_argument("--weight-version", default="default", help="the initial weight version string (SGLang's default)")
    p.add_argument("--served-model-name", default=None, help="the model id in /v1/models (default: --model)")
    p.add_argument(
        "--max-body-mb",
        type=int,
        default=None,
        help="largest request body accepted (default 64; 413 above; tensor pushes need room; local backend)",
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
    p.set_defaults(handler=_cmd_serve_engine)
