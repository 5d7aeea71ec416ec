"""The embedded engine as an engine kind (`engine.kind: embedded`, alias `local`): built in the trainer's process
from the policy, weights handed over in place, served by `envhub serve-engine --backend embedded` over SGLang's
native HTTP API and the OpenAI-compatible routes."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from envhub.inference import InferenceEngine
from envhub.trainer.engines.kinds import EngineKind

if TYPE_CHECKING:
    import torch


def embedded_dtype(config: Any) -> Any:
    """The dtype the embedded engine serves the policy in: bf16 when the learner computes in bf16 (engine.dtype
    auto), else `engine.dtype` ("auto": bf16 on GPUs and on CPUs with bf16 units, fp32 elsewhere)."""
    import torch

    from envhub.trainer.learner.precision import resolve_precision

    learner_dtype = resolve_precision(config.model.device, config.model.dtype).engine_dtype
    if config.engine.dtype == "auto" and learner_dtype == torch.bfloat16:
        return torch.bfloat16
    return config.engine.dtype


def served_dtype(config: Any, model: Any) -> torch.dtype:
    """The torch dtype the embedded engine, or the held-out evaluation, serves `model` in on its device."""
    from envhub.trainer.engines.embedded.hardware import engine_dtype

    return engine_dtype(embedded_dtype(config), next(model.parameters()).device)


class EmbeddedKind(EngineKind):
    name = "embedded"
    in_process = True

    async def build(self, config: Any, model: Any, tokenizer: Any) -> InferenceEngine:
        from envhub.trainer.engines.embedded.engine import EmbeddedEngine
        from envhub.trainer.models import copy_as

        cfg, dtype = config.engine, served_dtype(config, model)
        return EmbeddedEngine(
            copy_as(model, dtype).eval(),
            tokenizer,
            max_batch_size=cfg.max_batch_size,
            prefix_cache_mb=cfg.prefix_cache_mb,
            prefill_chunk=cfg.prefill_chunk,
            dtype=dtype,
            kv_cache_mb=cfg.kv_cache_mb,
            cuda_graphs=None if cfg.cuda_graphs else False,
            priority=cfg.priority,
            pack_prefill=cfg.pack_prefill,
        )

    def processes(self, config: Any, cuda: bool) -> list[Any]:
        from envhub.trainer.engines.placement import EngineProcess

        cfg = config.engine
        # engine.dtype auto serves bf16 on GPUs and beside a bf16 learner; an fp32 CPU run may still pick bf16 (AMX)
        fp32 = cfg.dtype == "float32" or (cfg.dtype == "auto" and not cuda and config.model.dtype != "bfloat16")
        budget = int((cfg.kv_cache_mb + cfg.prefix_cache_mb) * 2**20)  # live rows' KV and earlier turns' KV
        # on CUDA with graphs the cache is allocated once as max_batch_size + 1 equal rows (kv_cache.py)
        rows = cfg.max_batch_size if cuda and cfg.cuda_graphs else 0
        return [
            EngineProcess(
                "embedded engine", "trainer", kv_budget_bytes=budget, dtype_bytes=4 if fp32 else 2,
                static_rows=rows, static_bytes=int(cfg.kv_cache_mb * 2**20), packed_weights=not (cuda or fp32),
            )
        ]  # fmt: skip

    async def worker_endpoint(
        self, engine: Any, *, host: str, bind: str, api_key: str | None
    ) -> tuple[str, Any | None]:
        from envhub.trainer.engines.server.app import serve_to_workers

        return await serve_to_workers(engine, host=host, bind=bind, api_key=api_key)

    def serve(self, args: Any) -> int:
        from aiohttp import web

        from envhub.errors import EngineError
        from envhub.trainer.engines.embedded.engine import EmbeddedEngine
        from envhub.trainer.engines.server.app import create_app
        from envhub.trainer.engines.server.security import API_KEY_ENV, check_bind, default_weights_dir

        api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
        check_bind(args.host, api_key)  # before loading the model: refuse fast
        weights_dirs = args.allow_weights_dir or [default_weights_dir()]
        engine = EmbeddedEngine.from_pretrained(
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
