"""SGLang as an engine kind (`engine.kind: sglang`): servers attached by URL (maybe behind sglang-router) or
launched, weights pushed from a saved directory, as CUDA IPC tensors or over an NCCL group, Ray workers sent to the
router or the servers themselves. SGLang serves itself (`python -m sglang.launch_server`), not serve-engine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError
from envhub.inference import InferenceEngine
from envhub.trainer.engines.kinds import EngineKind, push_through_disk


class SGLangKind(EngineKind):
    name = "sglang"

    def check(self, config: Any) -> None:
        engine = config.engine
        if engine.launch is not None and (engine.url or engine.router_url):
            raise ConfigError(
                "engine has both launch and url: attach to running servers or launch them, not both",
                hint="drop engine.url (launch) or engine.launch (attach)",
            )
        if engine.launch is None and not engine.url:
            raise ConfigError(
                "engine.kind sglang needs engine.url (running servers) or engine.launch (start SGLang)",
                hint="e.g. url: http://127.0.0.1:30000, or launch: {num_servers: 1}",
            )
        if engine.weight_sync == "http":
            raise ConfigError(
                "engine.weight_sync http is kind vllm's (its servers fetch the weights over HTTP)",
                hint="with SGLang and no shared disk use weight_sync: nccl (or tensor for colocated servers)",
            )
        if engine.tp_size < 1 or engine.bucket_mb <= 0:
            raise ConfigError(
                f"engine.tp_size must be >= 1 and bucket_mb > 0, got {engine.tp_size}, {engine.bucket_mb}"
            )
        if engine.launch is not None:
            _check_launch(engine.launch, engine.api_key)

    def processes(self, config: Any, cuda: bool) -> list[Any]:
        from envhub.trainer.engines.placement import attached

        engine = config.engine
        if engine.launch is None:
            servers = attached(engine.url, "sglang", "/model_info")  # /model_info: up, without generating
            if engine.router_url:
                servers += [_router(engine.router_url, "remote")]
            return servers
        return _launched(config)

    def check_launch(self, config: Any) -> None:
        if config.engine.launch is None:
            return
        import torch

        from envhub.errors import EngineError
        from envhub.trainer.engines.sglang.launch import INSTALL_HINT, check_gpus, check_installed, plan_launch

        if not torch.cuda.is_available():
            raise EngineError("engine.launch starts SGLang, which needs CUDA GPUs; this machine has none", INSTALL_HINT)
        launch = config.engine.launch
        check_installed(launch.python or sys.executable, router=launch.router is not None)
        plan = plan_launch(launch, model_path="-", tp_size=config.engine.tp_size, dtype="bfloat16")
        check_gpus(plan, torch.cuda.device_count())

    async def build(self, config: Any, model: Any, tokenizer: Any) -> InferenceEngine:
        from envhub.trainer.engines.sglang.deploy import build_deployment

        # attached (engine.url, checked now) or launched (engine.launch) SGLang servers, maybe behind sglang-router
        return await build_deployment(config, model, tokenizer)

    async def send_weights(
        self, engine: Any, state: dict[str, Any], learner: Any, version: int, config: Any, out_dir: Path
    ) -> None:
        if config.engine.weight_sync == "disk":
            await push_through_disk(engine, state, learner, version, out_dir)
        else:
            await engine.update_weights(state, version=version)  # CUDA IPC tensors or an NCCL broadcast

    async def worker_endpoint(
        self, engine: Any, *, host: str, bind: str, api_key: str | None
    ) -> tuple[str, Any | None]:
        return await engine.generation_url(), None  # the router, or the servers (launched ones start here)


def _check_launch(launch: Any, api_key: str) -> None:
    if launch.num_servers < 1:
        raise ConfigError(f"engine.launch.num_servers must be at least 1, got {launch.num_servers}")
    if not 0 <= launch.mem_fraction_static < 1:
        raise ConfigError(f"engine.launch.mem_fraction_static must be in [0, 1), got {launch.mem_fraction_static}")
    from envhub.trainer.engines.server.security import is_loopback

    if not api_key and not is_loopback(launch.host):
        raise ConfigError(
            f"engine.launch.host {launch.host} reaches beyond this machine without an API key",
            hint="set engine.api_key (SGLang's --api-key), or keep host: 127.0.0.1",
        )


def _router(url: str, where: Any) -> Any:
    from envhub.trainer.engines.placement import EngineProcess

    return EngineProcess("sglang-router", where, url=url.rstrip("/"), health_path="/health", holds_weights=False)


def _launched(config: Any) -> list[Any]:
    """The servers (and router) `engine.launch` starts: GPUs, tp and memory fraction of each."""
    from envhub.trainer.engines.placement import EngineProcess
    from envhub.trainer.engines.sglang.launch import plan_launch

    engine, launch = config.engine, config.engine.launch
    model_path = launch.model_path or "RUN_DIR/weights/initial"
    plan = plan_launch(launch, model_path=model_path, tp_size=engine.tp_size, dtype="bfloat16")
    found = [
        EngineProcess(f"sglang-{i}", "local", gpus=s.gpus, tp=s.tp_size, memory_fraction=launch.mem_fraction_static,
                      url=s.url, health_path="/ready")
        for i, s in enumerate(plan.servers)
    ]  # fmt: skip
    if plan.router_url:
        found.append(_router(plan.router_url, "local"))
    return found
