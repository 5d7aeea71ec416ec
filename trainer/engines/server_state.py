"""The engine server's shared state and request plumbing: what `/generate`, the OpenAI routes and the
weight-update routes all reach (the served engine, SGLang's pause/update gate, version labels, rids)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from envhub.errors import EngineError
from envhub.inference import GenerateResult
from envhub.trainer.engines.gate import GenerationGate
from envhub.trainer.engines.local import LocalEngine
from envhub.trainer.engines.server_security import WeightsPolicy
from envhub.trainer.engines.sglang_protocol import GenerateCall, weight_spans


@dataclass
class EngineServerState:
    """The served engine plus what SGLang's tokenizer manager keeps: pause/update gate, versions, rids."""

    engine: LocalEngine
    model_path: str
    weights: WeightsPolicy
    gate: GenerationGate = field(default_factory=GenerationGate)
    labels: dict[int, str] = field(default_factory=dict)  # engine version number -> SGLang version string
    active: set[str] = field(default_factory=set)
    served_model_name: str = ""
    weight_groups: dict[str, Any] = field(default_factory=dict)  # open /init_weights_update_group groups

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

    async def update(self, load: Callable[[], Awaitable[Any]], label: Any, abort_all: bool) -> dict[str, Any]:
        """Run `load` under SGLang's rule (waits for in-flight generations unless paused); returns the reply."""
        if label is not None and not isinstance(label, str):
            raise EngineError(f"weight_version must be a string, got {label!r}")
        if abort_all:
            await self.abort(None)
        async with self.gate.update():
            await load()
            self.set_label(label)
        message = "Succeeded to update model weights."
        if label is not None:
            message += f" Weight version updated to {label}."
        return {"success": True, "message": message, "num_paused_requests": 0}

    async def abort(self, rid: str | None) -> int:
        """Abort every running request whose rid starts with `rid` (SGLang's prefix match), or all."""
        targets = list(self.active) if rid is None else [r for r in self.active if r.startswith(rid)]
        return sum([await self.engine.abort(r) for r in targets])

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
