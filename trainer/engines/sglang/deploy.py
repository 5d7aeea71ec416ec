"""The SGLang servers of a training run as one engine: attached by URL or launched, generation through
sglang-router or envhub's sticky MultiEngine, control calls to every worker.

Generation goes to the router when there is one (the episode key travels as `X-SMG-Routing-Key`), else to the
workers through `MultiEngine`. Pause, continue, weight updates and aborts always go to each worker: the router has
no such routes. Weight pushes travel as `engine.weight_sync` says: `disk` (a directory every server can read),
`tensor` (the state dict in SGLang's CUDA IPC format: servers on the trainer's host) or `nccl` (one process
group, trainer rank 0, servers at their rank offsets, formed at the first push). Launched servers start at the
first call that needs them and stop on `close()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.errors import EngineError
from envhub.inference import GenerateResult, InferenceEngine, SamplingParams
from envhub.trainer.engines.launcher import free_port
from envhub.trainer.engines.routing import MultiEngine
from envhub.trainer.engines.sglang.client import SGLangEngine
from envhub.trainer.engines.sglang.launch import Launched, LaunchPlan, StartServer, launch, start_managed


@dataclass(frozen=True)
class GroupSpec:
    """Where the trainer hosts the NCCL (or gloo) weight group."""

    backend: str = "nccl"
    address: str = "127.0.0.1"
    timeout_s: float = 600.0


class SGLangDeployment(InferenceEngine):
    """Several SGLang servers (and maybe a router) behind the InferenceEngine contract."""

    def __init__(
        self,
        workers: list[SGLangEngine],
        *,
        router_url: str | None = None,
        weight_sync: str = "disk",
        group: GroupSpec | None = None,
        plan: LaunchPlan | None = None,
        start: StartServer = start_managed,
    ) -> None:
        if weight_sync not in ("disk", "tensor", "nccl"):
            raise EngineError(f"unknown weight_sync {weight_sync!r}", hint="use disk, tensor or nccl")
        self.workers = MultiEngine(workers)
        self.router = None
        if router_url:
            first = workers[0]
            self.router = SGLangEngine(
                router_url, api_key=first.api_key, pause_mode=first.pause_mode, max_resubmits=first.max_resubmits
            )
        self.weight_sync = weight_sync
        self.group_spec = group or GroupSpec()
        self.plan = plan
        self.launched: Launched | None = None
        self._start = start
        self._lock = asyncio.Lock()
        self._group: Any = None

    @property
    def front(self) -> InferenceEngine:
        """Where generation goes: the router, else the workers' sticky routing."""
        return self.router if self.router is not None else self.workers

    @property
    def version(self) -> int:
        return self.workers.version

    async def start(self) -> None:
        """Launch the planned servers (once; a no-op when attached)."""
        async with self._lock:
            if self.plan is None or self.launched is not None:
                return
            self.launched = await launch(self.plan, self._start)

    async def generation_url(self) -> str:
        """The URL(s) rollout workers elsewhere should generate on (the router, or the workers comma-separated)."""
        await self.start()
        return self.router.url if self.router is not None else ",".join(e.url for e in self.workers.engines)

    def raise_if_failed(self) -> None:
        """Raise the exit of a launched server or router that stopped on its own (the run cannot go on)."""
        if self.launched is not None:
            self.launched.raise_if_failed()

    async def generate(self, input_ids: list[int], sampling: SamplingParams, **kwargs: Any) -> GenerateResult:
        """Generate through the router or the least-loaded worker (turns of one episode stay on one server)."""
        await self.start()
        self.raise_if_failed()
        return await self.front.generate(input_ids, sampling, **kwargs)

    async def update_weights(self, path_or_state: Any, version: int | None = None, **kwargs: Any) -> None:
        """Push a checkpoint directory (disk) or a state dict (tensor or nccl, as configured) to every worker."""
        await self.start()
        if isinstance(path_or_state, (str, Path)) or self.weight_sync == "tensor":
            await self.workers.update_weights(path_or_state, version=version, **kwargs)
            return
        if not isinstance(path_or_state, Mapping) or self.weight_sync != "nccl":
            raise EngineError(
                "weight_sync disk pushes a checkpoint directory", hint="save the policy and pass the directory"
            )
        if self._group is None:
            self._group = await self._join_group()
        await self.workers.update_weights_from_distributed(path_or_state, self._group, version)

    async def _join_group(self) -> Any:
        import torch

        spec = self.group_spec
        if spec.backend == "nccl":
            if not torch.cuda.is_available():
                raise EngineError("weight_sync nccl needs a CUDA GPU for the trainer's rank 0", hint="use disk")
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        port = free_port(spec.address)  # the group's store: rank 0 (this process) listens there
        return await self.workers.init_weights_update_group(
            spec.address, port, spec.backend, device, timeout_s=spec.timeout_s
        )

    async def pause(self, **kwargs: Any) -> None:
        """Pause every worker."""
        await self.workers.pause(**kwargs)

    async def resume(self) -> None:
        """Continue every worker."""
        await self.workers.resume()

    async def abort(self, rid: str | None = None) -> None:
        """Abort `rid` (its live attempt) or everything, on every worker (the router has no abort route)."""
        if self.router is None:
            await self.workers.abort(rid)
            return
        body = self.router.mark_aborted(rid)
        await asyncio.gather(*[w.send_abort(body) for w in self.workers.engines])

    async def health(self) -> bool:
        """True when every worker (and the router, if any) is up."""
        checks = [self.workers.health()] + ([self._router_ready()] if self.router is not None else [])
        return all(await asyncio.gather(*checks))

    async def check_attached(self) -> None:
        """Before a run on attached servers: each worker answers /model_info as SGLang does and the router (if
        any) /readiness; else EngineError naming the URL and the fix (a wrong URL fails now, not every episode)."""
        await asyncio.gather(*[_check_worker(w) for w in self.workers.engines])
        if self.router is not None and await self.router.probe("/readiness") != 200:
            raise EngineError(
                f"engine.router_url {self.router.url} does not answer /readiness as sglang-router does",
                hint="start python -m sglang_router.launch_router --worker-urls ... there, or fix engine.router_url",
            )

    async def _router_ready(self) -> bool:
        assert self.router is not None
        return await self.router.probe("/readiness") == 200

    async def close(self) -> None:
        """Leave the weight group, close the clients and stop what was launched."""
        try:
            if self._group is not None:
                await self.workers.destroy_weights_update_group(self._group.name)
                await asyncio.to_thread(self._group.close)
        except EngineError:
            pass  # servers already gone: nothing to leave
        finally:
            self._group = None
            await self.workers.close()
            if self.router is not None:
                await self.router.close()
            if self.launched is not None:
                await self.launched.stop()
                self.launched = None


async def _check_worker(worker: SGLangEngine) -> None:
    """EngineError unless `worker` answers /model_info with SGLang's model_path and weight_version."""
    try:
        info = await worker.model_info()
    except EngineError as exc:
        status, server_info = await worker.get_json("/get_server_info")
        if status == 200 and "routers_count" in str(server_info):  # the router's answer (not typed as JSON)
            raise EngineError(
                f"engine.url {worker.url} is an sglang-router, not an SGLang server",
                hint="put the router in engine.router_url and the servers behind it in engine.url",
            ) from exc
        raise EngineError(
            f"engine.url {worker.url} is not an SGLang server that answers: {exc.args[0]}",
            hint="start one there (python -m sglang.launch_server, or envhub serve-engine), or fix engine.url",
        ) from exc
    if not {"model_path", "weight_version"} <= set(info):
        raise EngineError(
            f"engine.url {worker.url} answered /model_info without SGLang's model_path and weight_version",
            hint="engine.kind sglang speaks SGLang's API (for a vLLM server use engine.kind vllm)",
        )


async def build_deployment(config: Any, model: Any, tokenizer: Any) -> SGLangDeployment:
    """`deployment_from_config` off the event loop (it may check the install and export the policy); attached
    servers are checked before the run starts."""
    deployment = await asyncio.to_thread(deployment_from_config, config, model, tokenizer)
    if deployment.plan is None:
        try:
            await deployment.check_attached()
        except BaseException:
            await deployment.close()
            raise
    return deployment


def deployment_from_config(
    config: Any, model: Any, tokenizer: Any, start: StartServer = start_managed
) -> SGLangDeployment:
    """The deployment `config.engine` (kind sglang) describes. Launching checks the install and the GPUs here,
    exports the initial policy when no model_path is given, and starts the servers at first use."""
    cfg = config.engine
    client = {
        "api_key": cfg.api_key or None,
        "admin_api_key": cfg.admin_api_key or None,
        "pause_mode": cfg.pause_mode,
        "tensor_format": cfg.tensor_format,
        "tp_size": cfg.tp_size,
        "bucket_bytes": int(cfg.bucket_mb * 1024 * 1024),
    }
    group = GroupSpec(cfg.group_backend, cfg.group_address)
    if cfg.launch is None:
        urls = [u.strip() for u in cfg.url.split(",") if u.strip()]
        workers = [SGLangEngine(u, **client) for u in urls]
        return SGLangDeployment(workers, router_url=cfg.router_url or None, weight_sync=cfg.weight_sync, group=group)
    import torch

    from envhub.trainer.engines.sglang.launch import check_gpus, check_installed, plan_launch
    from envhub.trainer.learner.precision import resolve_precision

    precision = resolve_precision(config.model.device, config.model.dtype)
    dtype = str(precision.engine_dtype).removeprefix("torch.")
    initial = Path(config.out_dir) / "weights" / "initial"
    plan = plan_launch(
        cfg.launch,
        model_path=cfg.launch.model_path or str(initial),
        tp_size=cfg.tp_size,
        dtype=dtype,
        api_key=cfg.api_key,
        admin_api_key=cfg.admin_api_key,
    )
    check_installed(plan.servers[0].command.python, router=plan.router is not None)
    trainer_gpu = None
    if cfg.weight_sync == "nccl" and precision.device.type == "cuda":
        trainer_gpu = precision.device.index or 0
    check_gpus(plan, torch.cuda.device_count(), trainer_gpu)
    if not cfg.launch.model_path:
        export_initial_policy(model, tokenizer, initial, precision.engine_dtype)
    workers = [SGLangEngine(s.url, **client) for s in plan.servers]
    return SGLangDeployment(
        workers, router_url=plan.router_url, weight_sync=cfg.weight_sync, group=group, plan=plan, start=start
    )


def export_initial_policy(model: Any, tokenizer: Any, path: Path, dtype: Any) -> Path:
    """The policy as a Hugging Face directory SGLang can load (weights in `dtype`, config, tokenizer)."""
    from envhub.trainer.learner.precision import export_weights

    export_weights(model, path, dtype)
    tokenizer.save_pretrained(path)
    return path
