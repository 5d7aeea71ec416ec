"""The engine server's shared state and request plumbing: what `/generate`, the OpenAI routes and the
weight-update routes all reach (the served engine, SGLang's pause/update gate, version labels, rids, health)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from envhub.errors import EngineError
from envhub.inference import GenerateResult, SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.protocol import GenerateCall, weight_spans
from envhub.trainer.engines.server.gate import GenerationGate
from envhub.trainer.engines.server.security import WeightsPolicy


@dataclass
class EngineServerState:
    """The served engine plus what SGLang's tokenizer manager keeps: pause/update gate, versions, rids."""

    engine: EmbeddedEngine
    model_path: str
    weights: WeightsPolicy
    gate: GenerationGate = field(default_factory=GenerationGate)
    labels: dict[int, str] = field(default_factory=dict)  # engine version number -> SGLang version string
    active: set[str] = field(default_factory=set)
    served_model_name: str = ""
    weight_groups: dict[str, Any] = field(default_factory=dict)  # open /init_weights_update_group groups
    session: str | None = None  # the selector of an open /begin_weight_update session
    healthy: bool = True  # False after a /health check timed out, until one succeeds (SGLang's UnHealthy)
    health_check_timeout: float = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT

    @property
    def weight_version(self) -> str:
        """The version string new tokens are tagged with (an in-process push to the engine reads as its number)."""
        return self.labels.get(self.engine.version, str(self.engine.version))

    @property
    def context_len(self) -> int:
        return self.engine.max_positions

    def set_label(self, label: str | None) -> None:
        """Tag tokens from now on with `label` (None keeps the current string, as SGLang does)."""
        current = self.weight_version
        self.engine.version += 1  # a fresh engine number, so earlier tokens keep their old label
        self.labels[self.engine.version] = current if label is None else label

    async def update(
        self, load: Callable[[], Awaitable[Any]], label: Any, abort_all: bool, flush_cache: Any = True
    ) -> dict[str, Any]:
        """Run `load` under SGLang's rule (waits for in-flight generations unless paused), then flush the prefix
        cache unless told not to; a refused flush fails the call although the weights were loaded, as in SGLang."""
        if label is not None and not isinstance(label, str):
            raise EngineError(f"weight_version must be a string, got {label!r}")
        if not isinstance(flush_cache, bool):
            raise EngineError(f"flush_cache must be a boolean, got {flush_cache!r}")
        if abort_all:
            await self.abort(None)
        async with self.gate.update():
            await load()
            self.set_label(label)
            # SGLang flushes only when nothing runs (waiting requests count unless paused): an in_place pause keeps
            # its batch, so an update then needs flush_cache false.
            if flush_cache and not await self.engine.flush_cache(ignore_waiting=self.gate.paused):
                return {
                    "success": False,
                    "message": "Weights were updated, but the cache was not flushed because requests are still "
                    "running or queued. Retract or finish them, then call /flush_cache.",
                    "num_paused_requests": 0,
                }
        message = "Succeeded to update model weights."
        if label is not None:
            message += f" Weight version updated to {label}."
        return {"success": True, "message": message, "num_paused_requests": 0}

    async def abort(self, rid: str | None) -> int:
        """Abort all requests, or, when `rid` itself is running, every running request whose rid starts with it.

        As SGLang: its tokenizer manager drops an abort whose exact rid is not live, and its scheduler then
        matches by prefix (so `job-1` also ends `job-10`)."""
        if rid is not None and rid not in self.active:
            return 0
        targets = list(self.active) if rid is None else [r for r in self.active if r.startswith(rid)]
        return sum([await self.engine.abort(r) for r in targets])

    async def health_check(self) -> bool:
        """SGLang's /health: a 1-token generation (it waits out a pause like any other); any token the engine
        produces within `health_check_timeout` counts. A timeout marks the server unhealthy."""
        if not await self.engine.health():
            return False
        before = self.engine.stats.tokens
        probe = GenerateCall([0], SamplingParams(max_new_tokens=1, temperature=0), f"HEALTH_CHECK_{uuid.uuid4().hex}")
        task = asyncio.create_task(self.run(probe))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.health_check_timeout
        try:
            while loop.time() < deadline and not (task.done() and task.exception() is not None):
                if task.done() or self.engine.stats.tokens > before:
                    self.healthy = True
                    return True
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
        self.healthy = False
        return False

    async def ready(self) -> bool:
        """SGLang's /ready: healthy and not paused."""
        return self.healthy and not self.gate.paused and await self.engine.health()

    async def run(self, call: GenerateCall, index: int = 0, on_token: Any = None) -> GenerateResult:
        """Generate one prompt under the gate, tracked by rid for prefix aborts."""
        rid = call.rid if call.rid is not None else uuid.uuid4().hex
        if call.n > 1:
            rid = f"{rid}-{index}"
        if rid in self.active:
            raise EngineError(f"a request with rid {rid!r} is already running")
        self.active.add(rid)
        try:
            async with self.gate.generation():
                return await self.engine.generate(
                    call.input_ids, call.sampling, rid=rid, resubmit_aborted=False, on_token=on_token
                )
        finally:
            self.active.discard(rid)

    def spans(self, result: GenerateResult) -> list[dict[str, Any]]:
        return weight_spans(result.token_versions, self.labels, self.weight_version)

    def text(self, ids: list[int]) -> str:
        tokenizer = self.engine.tokenizer
        return tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else ""


STATE_KEY = web.AppKey("engine_state", EngineServerState)


def error_response(status: int, message: str) -> web.Response:
    """SGLang's error body: {"error": {"message": ...}}."""
    return web.json_response({"error": {"message": message}}, status=status)


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object (an empty body is {}); EngineError otherwise."""
    if not request.body_exists or not await request.read():  # read() is cached, so a middleware may have read it first
        return {}
    try:
        body = await request.json()
    except ValueError as exc:
        raise EngineError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise EngineError("request body must be a JSON object")
    return body
