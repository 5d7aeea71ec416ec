"""A fake engine kind for tests, defined outside envhub the way a user would: `engine.kind: counting` serves the
policy in-process on the embedded engine's machinery and counts every generate call. Nothing in envhub names it:
`envhub train`, `envhub serve-engine --backend counting` and a Ray run reach it through the kind registry alone."""

from __future__ import annotations

import copy
from typing import Any

from envhub.trainer.engines import EngineKind, register_engine_kind
from envhub.trainer.engines.embedded.engine import EmbeddedEngine


class CountingEngine(EmbeddedEngine):
    generated = 0  # generate calls in this process, every instance together

    async def generate(self, input_ids: list[int], sampling: Any, **kwargs: Any) -> Any:
        type(self).generated += 1
        return await super().generate(input_ids, sampling, **kwargs)

    async def close(self) -> None:
        print(f"counting kind: {type(self).generated} generate calls", flush=True)  # what a CLI run's test reads
        await super().close()


class CountingKind(EngineKind):
    name = "counting"
    in_process = True

    async def build(self, config: Any, model: Any, tokenizer: Any) -> Any:
        return CountingEngine(copy.deepcopy(model).eval(), tokenizer, max_batch_size=8)

    async def worker_endpoint(self, engine: Any, *, host: str, bind: str, api_key: str | None) -> Any:
        from envhub.trainer.engines.server.app import serve_to_workers

        return await serve_to_workers(engine, host=host, bind=bind, api_key=api_key)

    def serve(self, args: Any) -> int:
        from aiohttp import web

        from envhub.trainer.engines.server.app import create_app

        engine = CountingEngine.from_pretrained(args.model, device="cpu", dtype="float32")
        print(f"counting kind: serving {args.model} at http://{args.host}:{args.port}", flush=True)
        web.run_app(create_app(engine, args.model), host=args.host, port=args.port, print=None)
        return 0


register_engine_kind(CountingKind)
