"""The recording gateway: an OpenAI-compatible endpoint in front of the trainer's engine (any `InferenceEngine`),
one API key per episode, every call recorded token for token.

Why a key per episode rather than a path per episode: every harness honours OPENAI_API_KEY and sends it as a
bearer token on every request, while base-URL paths are rewritten by some clients (a `/v1` appended or dropped,
query strings lost). The key is random (256 bits), known only to the episode's harness, and answers 401 once the
episode is closed.

Trust: clients are hostile. Each request passes envhub's one trust layer (`envhub.server.guard.ClientGuard`: body
size cap and deadline, JSON nesting bound, a request-rate bucket per episode), then the gateway's own limits: the
served model name, `n` 1, `max_tokens` at most `max_tokens_per_request`, and a per-episode budget of sampled tokens.
Routes: /v1/models, /v1/chat/completions and /v1/completions (`chat`), /v1/responses (`responses`), /mcp (the
episode's env tools, `mcp`); /health is open.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from envhub.errors import EngineError
from envhub.inference import InferenceEngine
from envhub.server.guard import ClientGuard, HTTPError, ServerLimits
from envhub.trainer.gateway import chat, mcp, responses
from envhub.trainer.gateway.episodes import EPISODE, Episode, EpisodeBook, EpisodeHandle, RecordedCall
from envhub.trainer.gateway.errors import RequestError, error_response
from envhub.trainer.gateway.mcp import EpisodeTools
from envhub.trainer.gateway.render import ChatRenderer, Prompt


@dataclass(frozen=True)
class GatewayConfig:
    """What the gateway serves and how much a client may ask of it."""

    model_name: str = "policy"  #: the one model id clients name (OPENAI_MODEL)
    max_tokens_per_request: int = 1024  #: largest max_tokens a request may ask for (400 above); the default when absent
    episode_token_budget: int = 8192  #: sampled tokens one episode may use across its calls (400 once spent)
    max_context_tokens: int = 4096  #: prompt plus max_tokens of one call (400 context_length_exceeded above)
    temperature: float | None = None  #: when set, every call samples at this temperature whatever the client asks
    limits: ServerLimits = field(
        default_factory=lambda: ServerLimits(max_body=4 << 20, rate_limit=50.0, body_timeout=30.0)
    )  #: the trust layer's body size, body deadline and per-episode request rate


class Gateway:
    """Serves `engine` to harnesses and records each episode's calls; `open_episode` / `close_episode` bracket one."""

    def __init__(self, engine: InferenceEngine, tokenizer: Any, config: GatewayConfig | None = None) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.config = config or GatewayConfig()
        self.renderer = ChatRenderer(tokenizer)
        self.book = EpisodeBook()
        self.guard = ClientGuard((), self.config.limits)
        self.vocab_size = len(tokenizer)
        self._runner: web.AppRunner | None = None
        self.url = ""

    @property
    def model_name(self) -> str:
        """The one model id clients name."""
        return self.config.model_name

    # -- lifecycle ----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        """The aiohttp application with the trust middleware and every route."""
        app = web.Application(client_max_size=self.config.limits.max_body, middlewares=[self._middleware])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        chat.add_routes(app, self)
        responses.add_routes(app, self)
        mcp.add_routes(app, self)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on host:port (0: a free port); returns the base URL (`.../v1`)."""
        runner = web.AppRunner(self.app(), handle_signals=False, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        self._runner = runner
        self.url = f"http://{host}:{runner.addresses[0][1]}/v1"
        return self.url

    async def listen_unix(self, path: str) -> web.UnixSite:
        """Also serve on a unix socket at `path` (bind-mounted into a network-less sandbox, whose forwarder relays
        to it); the same per-episode keys apply. Stop it with `await site.stop()`."""
        if self._runner is None:
            raise EngineError("the gateway is not serving", hint="await gateway.start() first")
        site = web.UnixSite(self._runner, path)
        await site.start()
        os.chmod(path, 0o666)  # the sandbox user (uid 1000) connects; the socket's folder is the sandbox's alone
        return site

    async def stop(self) -> None:
        """Stop listening (the engine stays the caller's)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open_episode(
        self, token_budget: int | None = None, tools: EpisodeTools | None = None, sampling_key: str | None = None
    ) -> EpisodeHandle:
        """A new episode and the handle its harness uses (base URL, fresh API key, model name); `tools`, when
        given, are served to it over MCP at /mcp. With `sampling_key` (rollout.seeded) its i-th call samples from
        its own generator, seeded by the key and i as the rollout loop's turns are, whatever seed the program
        sends: the episode no longer depends on how the engine batched it."""
        if not self.url:
            raise EngineError("the gateway is not serving", hint="await gateway.start() first")
        episode, key = self.book.open(token_budget or self.config.episode_token_budget, tools, sampling_key)
        return EpisodeHandle(episode.episode_id, self.url, key, self.config.model_name, mcp=tools is not None)

    def close_episode(self, handle: EpisodeHandle) -> list[RecordedCall]:
        """End the episode (its key is refused from now on) and return its recorded calls in order."""
        return self.book.close(self.book.get(handle.episode_id))

    # -- trust --------------------------------------------------------------------------------------
    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if request.path != "/health":
                episode = self._episode_of(request)
                self.guard.admit(f"episode:{episode.episode_id}")
                request[EPISODE] = episode
            return await handler(request)
        except HTTPError as exc:
            return error_response(exc)

    def _episode_of(self, request: web.Request) -> Episode:
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise RequestError(
                401, "no API key: send `Authorization: Bearer KEY` with the episode's OPENAI_API_KEY", "invalid_api_key"
            )
        episode = self.book.lookup(key.strip())
        if episode is None:
            raise RequestError(
                401,
                "incorrect API key: it belongs to no open episode (it may have ended); use the episode's "
                "OPENAI_API_KEY",
                "invalid_api_key",
            )
        return episode

    async def body(self, request: web.Request) -> dict[str, Any]:
        """The request's JSON object through the trust layer, with the served model checked."""
        body = await self.guard.read_json(request)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError(400, "model is required: send the episode's OPENAI_MODEL", param="model")
        if model != self.config.model_name:
            raise RequestError(
                404,
                f"the model {model[:100]!r} does not exist here; this gateway serves {self.config.model_name!r}",
                "model_not_found",
                "model",
            )
        return body

    # -- generation ---------------------------------------------------------------------------------
    def sampling(self, body: dict[str, Any], episode: Episode, prompt_len: int) -> Any:
        """The request's sampling parameters within the gateway's limits (400 naming the limit otherwise)."""
        from envhub.trainer.engines.protocol import parse_sampling
        from envhub.trainer.engines.server.openai_api import sampling_json

        cfg = self.config
        params = sampling_json(body)
        requested = params.pop("max_new_tokens", None)
        try:
            sampling, n = parse_sampling(params, self.vocab_size)
        except EngineError as exc:
            raise RequestError(400, str(exc)) from None
        if n != 1:
            raise RequestError(400, f"n must be 1 here (got {n}): each call is one recorded sample", param="n")
        if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
            raise RequestError(400, f"max_tokens must be a positive integer, got {requested!r}", param="max_tokens")
        if requested is not None and requested > cfg.max_tokens_per_request:
            raise RequestError(
                400,
                f"max_tokens {requested} is over this gateway's per-request limit of {cfg.max_tokens_per_request}",
                param="max_tokens",
            )
        left = episode.tokens_left
        if left <= 0:
            raise RequestError(
                400,
                f"this episode spent its token budget of {episode.token_budget} sampled tokens; end the episode",
                "token_budget_exhausted",
            )
        max_new = min(requested or cfg.max_tokens_per_request, left)  # near the budget's end, calls get what is left
        if prompt_len + max_new > cfg.max_context_tokens:
            raise RequestError(
                400,
                f"This model's maximum context length is {cfg.max_context_tokens} tokens. However, you requested "
                f"{prompt_len + max_new} tokens ({prompt_len} in the messages, {max_new} in the completion). "
                "Please reduce the length of the messages or completion.",
                "context_length_exceeded",
                "messages",
            )
        stops = tuple(sorted(set(sampling.stop_token_ids) | self.renderer.stop_ids))
        changes: dict[str, Any] = {"max_new_tokens": max_new, "stop_token_ids": stops}
        if cfg.temperature is not None:
            changes["temperature"] = cfg.temperature
        return dataclasses.replace(sampling, **changes)

    async def complete(
        self, request: web.Request, body: dict[str, Any], prompt: Prompt, route: str, tools_offered: bool
    ) -> RecordedCall:
        """Generate one answer to `prompt` on the engine and record it in the request's episode."""
        from envhub.trainer.engines import episode_key

        episode = request[EPISODE]
        sampling = self.sampling(body, episode, len(prompt.ids))
        index = self.book.reserve(episode, sampling.max_new_tokens)
        if episode.sampling_key is not None:
            from envhub.trainer.rollout.worker import sampling_seed

            sampling = dataclasses.replace(sampling, seed=sampling_seed(episode.sampling_key, index))
        started = time.monotonic()
        episode_key.set(episode.episode_id)  # an episode's calls stay on one engine (its prefix cache)
        try:
            result = await self.engine.generate(list(prompt.ids), sampling)
        except EngineError as exc:
            self.book.release(episode, sampling.max_new_tokens)
            raise RequestError(400, f"the engine refused the call: {exc}") from None
        except BaseException:
            self.book.release(episode, sampling.max_new_tokens)
            raise
        output = list(result.output_ids)
        versions = list(result.token_versions) or [result.weight_version] * len(output)
        call = RecordedCall(
            index=index,
            route=route,
            prompt_ids=list(prompt.ids),
            output_ids=output,
            logprobs=list(result.logprobs),
            versions=versions,
            finish_reason=result.finish_reason,
            message=self.renderer.reply(output, tools_offered),
            echoed=prompt.echoed,
            reencoded=prompt.reencoded,
            duration_s=time.monotonic() - started,
        )
        self.book.record(episode, call, sampling.max_new_tokens)
        return call

    def text(self, ids: list[int]) -> str:
        """Decoded output text (special tokens dropped)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- small routes -------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "episodes": len(self.book)})

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": self.config.model_name, "object": "model", "created": int(time.time()), "owned_by": "envhub"}
        return web.json_response({"object": "list", "data": [card]})
