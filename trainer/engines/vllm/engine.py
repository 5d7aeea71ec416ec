"""VLLMEngine: an InferenceEngine over a real vLLM server's HTTP API, launched and managed here or attached to.

Generation is token-in/token-out on vLLM's `/inference/v1/generate` (the prompt is our chat template's ids,
so ids never drift across turns), with the sampled token's logprob (`--logprobs-mode processed_logprobs`:
log_softmax(logits / T), what the learner computes) and vLLM's per-token `weight_versions` spans.

Weight pushes use the RL routes vLLM's own server defines (`VLLM_SERVER_DEV_MODE=1`): `POST /pause`, then
`POST /collective_rpc` with the worker's `reload_weights` from a safetensors directory (vLLM's NCCL/IPC
weight-transfer backends need a GPU), `/update_weight_version`, `/reset_prefix_cache` (a reload does not
drop KV computed with the old weights), `POST /resume`. With pause mode `abort` (the default) in-flight
requests come back `finish_reason: abort` with their partial tokens and are resubmitted here with those
tokens appended, so every token keeps the version that produced it; `keep` freezes them in place (the
pause resets vLLM's caches, so they recompute their KV under the new weights on resume and go on without being
resubmitted) and `wait` lets them finish first.

With a `WeightServer` (engine.weight_sync: http) a pushed state dict is not written where the server reads it:
the trainer serves it over HTTP and the server's workers fetch it (`envhub_fetch_weights`, envhub's worker
extension), so a server on another host needs no shared filesystem.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp

from envhub.errors import EngineError, EngineUnreachable
from envhub.inference import FinishReason, GenerateResult, InferenceEngine, SamplingParams
from envhub.trainer.engines.launcher import ManagedServer, free_port, module_command
from envhub.trainer.engines.resubmit import resubmit_until_done
from envhub.trainer.engines.sglang.client import span_versions
from envhub.trainer.engines.vllm.command import SERVER_MODULE, VLLMServerArgs, vllm_python, vllm_sampling
from envhub.trainer.engines.vllm.weight_server import WeightServer
from envhub.trainer.engines.vllm.weights import check_weights_dir, served_model_dir, write_safetensors

VLLMPauseMode = Literal["abort", "keep", "wait"]
# envhub's engine.pause_mode names (SGLang's) -> vLLM's: resubmitting an aborted request re-prefills it under
# the new weights, which is what SGLang's retract does; a blocking update is vLLM's "wait".
PAUSE_MODES: dict[str, VLLMPauseMode] = {
    "abort": "abort",
    "retract": "abort",
    "keep": "keep",
    "in_place": "keep",
    "wait": "wait",
    "none": "wait",
}
_CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


@dataclass
class PushTiming:
    """Seconds one weight push spent in each phase (rollouts are held only between pause and resume)."""

    version: int
    write_s: float  # state dict -> safetensors in /dev/shm (0 for a directory)
    pause_s: float
    reload_s: float
    resume_s: float
    paused_s: float  # from pause to resume: how long generation stood still
    total_s: float


class VLLMEngine(InferenceEngine):
    """InferenceEngine over vLLM's HTTP API; `launch()` starts and owns the server, the constructor attaches."""

    def __init__(
        self,
        url: str,
        *,
        server: ManagedServer | None = None,
        api_key: str | None = None,
        pause_mode: str = "abort",
        timeout: float = 900.0,
        connect_timeout: float = 10.0,
        retries: int = 3,
        max_resubmits: int = 32,
        owned_paths: tuple[Path, ...] = (),
        weight_server: WeightServer | None = None,
    ) -> None:
        if pause_mode not in PAUSE_MODES:
            raise EngineError(f"unknown pause_mode {pause_mode!r}", hint=f"use one of {', '.join(PAUSE_MODES)}")
        self.url = url.rstrip("/")
        self.server = server
        self.api_key = api_key or None
        self.pause_mode: VLLMPauseMode = PAUSE_MODES[pause_mode]
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self.retries = retries
        self.max_resubmits = max_resubmits
        self.version = 0
        self.pushes: list[PushTiming] = []
        self._owned_paths = owned_paths
        self.weight_server = weight_server  #: state-dict pushes are fetched from it over HTTP (shared)
        self.owns_weight_server = False  #: this engine's close stops the weight server (one engine of a run does)
        self._session: aiohttp.ClientSession | None = None
        self._active: dict[str, str] = {}  # envhub rid -> the vLLM request id of its current submission
        self._user_aborted: set[str] = set()
        self._push_lock = asyncio.Lock()
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------------------
    @classmethod
    async def launch(
        cls,
        model: str | Path,
        *,
        port: int = 0,
        dtype: str = "float32",
        max_model_len: int = 2048,
        kv_cache_gib: float = 2.0,
        served_model_name: str = "",
        startup_timeout: float = 600.0,
        log_path: str | Path | None = None,
        extra_args: tuple[str, ...] = (),
        owned_paths: tuple[Path, ...] = (),
        **client: Any,
    ) -> VLLMEngine:
        """Start `vllm serve` on 127.0.0.1 (RL routes on) for `model` ("smollm2", "tiny" or a Hugging Face
        directory) and wait until it answers /health."""
        python = vllm_python()
        args = VLLMServerArgs(
            model=str(served_model_dir(str(model))),
            port=port or free_port(),
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            served_model_name=served_model_name,
            extra=list(extra_args),
        )
        server = ManagedServer.start(
            "vllm", module_command(python, SERVER_MODULE, args.argv()), env=args.environment(python), log_path=log_path
        )
        try:
            await server.wait_ready(f"http://{args.host}:{args.port}/health", startup_timeout)
        except BaseException:
            await asyncio.to_thread(server.stop)
            raise
        return cls(f"http://{args.host}:{args.port}", server=server, owned_paths=owned_paths, **client)

    @classmethod
    async def attach(cls, url: str, **client: Any) -> VLLMEngine:
        """Connect to a running vLLM server, checking first that it answers, is vLLM (GET /version) and serves
        the RL routes a weight push needs (GET /is_paused): a wrong URL fails here, not after every episode."""
        engine = cls(url, **client)
        try:
            await engine._check_attached()
        except BaseException:
            await engine.close()
            raise
        return engine

    async def _check_attached(self) -> None:
        where = f"the server at {self.url}"
        start = "start one with `envhub serve-engine --backend vllm --rl-routes` or drop engine.url to launch one"
        try:
            async with self._client().get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as response:
                status = response.status
        except (*_CONNECTION_ERRORS, OSError) as exc:
            raise EngineError(f"no server answers at {self.url}/health ({exc!r})", hint=start) from exc
        if status != 200:
            raise EngineError(f"{where} answered {status} to GET /health: not a healthy vLLM server", hint=start)
        status, payload = await self._request("GET", "/version")
        if status != 200 or not isinstance(payload, dict) or not isinstance(payload.get("version"), str):
            raise EngineError(f"{where} is not vLLM: GET /version answered {status} {str(payload)[:200]}", hint=start)
        version = payload["version"]
        status, payload = await self._request("GET", "/is_paused")
        if status != 200 or not isinstance(payload, dict) or "is_paused" not in payload:
            raise EngineError(
                f"{where} is vLLM {version} but does not serve its RL routes (GET /is_paused answered {status}), "
                "so weights cannot be pushed",
                hint="start it with VLLM_SERVER_DEV_MODE=1 and --enable-scale-out (serve-engine's --rl-routes does)",
            )

    async def close(self) -> None:
        """Close the HTTP session; stop the server if this engine launched it."""
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
        for path in self._owned_paths:
            await asyncio.to_thread(shutil.rmtree, path, True)
        if self.owns_weight_server and self.weight_server is not None:
            await self.weight_server.stop()

    # -- HTTP ---------------------------------------------------------------------------------------
    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, connector=aiohttp.TCPConnector(limit=0), headers=headers
            )
        return self._session

    def raise_if_failed(self) -> None:
        """Raise the managed server's exit (its code and log tail) once it has stopped on its own."""
        if self.server is not None and self.server.returncode is not None and not self._closed:
            raise self.server.exit_error()

    async def _request(
        self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """One request. Connection failures are retried (unless the managed server has exited); a 5xx is
        retried only for GETs: a POST that failed on the server (a generation, a weight reload) is not
        repeated blindly."""
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            self.raise_if_failed()
            if attempt:
                await asyncio.sleep(min(0.25 * 2**attempt, 4.0))
                self.raise_if_failed()
            try:
                async with self._client().request(method, self.url + path, json=body, params=params) as response:
                    payload: Any = (
                        await response.json() if response.content_type == "application/json" else await response.text()
                    )
            except _CONNECTION_ERRORS as exc:
                last = exc
                await self._settle()
                continue
            if response.status == 401:
                raise EngineError(
                    f"{self.url}{path} answered 401 Unauthorized", hint="set engine.api_key to the server's --api-key"
                )
            if response.status >= 500:
                last = EngineError(f"{path} answered {response.status}: {_message(payload)}")
                await self._settle()
                if method != "GET":
                    break
                continue
            return response.status, payload
        self.raise_if_failed()
        raise (EngineUnreachable if isinstance(last, _CONNECTION_ERRORS) else EngineError)(
            f"vLLM at {self.url}{path} failed: {last}",
            hint="see the server's log; an attached server must run with VLLM_SERVER_DEV_MODE=1 --enable-scale-out",
        )

    async def _settle(self, seconds: float = 3.0) -> None:
        """After a failure, give a dying managed server a moment to exit, so the error can say how it ended."""
        if self.server is None:
            return
        deadline = time.monotonic() + seconds
        while self.server.returncode is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def _post(self, path: str, body: Any = None, params: dict[str, str] | None = None) -> Any:
        status, payload = await self._request("POST", path, body if body is not None else {}, params)
        if status == 404 and path != "/inference/v1/generate":
            raise EngineError(
                f"{self.url}{path} is not served (404)",
                hint="start vLLM with VLLM_SERVER_DEV_MODE=1 for its RL routes (/pause, /collective_rpc, ...)",
            )
        if status in (403, 404):
            raise EngineError(f"{self.url}{path} answered {status}", hint="start vLLM with --enable-scale-out")
        if status >= 400:
            raise EngineError(f"{path} failed ({status}): {_message(payload)}")
        return payload

    # -- generation ---------------------------------------------------------------------------------
    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, rid: str | None = None
    ) -> GenerateResult:
        """Generate with per-token logprobs; a request aborted by a weight push is resubmitted where it stopped."""
        if not input_ids:
            raise EngineError("generate needs at least one prompt token")
        return await resubmit_until_done(
            self._submit,
            rid,
            input_ids,
            sampling,
            max_resubmits=self.max_resubmits,
            live=self._active,
            user_aborted=self._user_aborted,
            version=self.version,
        )

    async def _submit(self, request_id: str, token_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        """One /inference/v1/generate call: its tokens, logprobs, per-token versions and finish reason."""
        body = {"request_id": request_id, "token_ids": list(token_ids), "sampling_params": vllm_sampling(sampling)}
        # a token labelled "default" (the server's weights before any push) or not labelled at all was sampled by the
        # weights live when it was submitted: a push finishing during the call must not relabel it
        submitted_version = self.version
        payload = await self._post("/inference/v1/generate", body)
        try:
            choice = payload["choices"][0]
            ids = [int(t) for t in choice.get("token_ids") or []]
            content = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [float(entry["logprob"]) for entry in content]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EngineError(
                f"vLLM's /inference/v1/generate answered an unexpected body: {str(payload)[:300]}"
            ) from exc
        if len(logprobs) != len(ids):
            raise EngineError(
                f"vLLM returned {len(ids)} tokens but {len(logprobs)} logprobs",
                hint="the server must run with --logprobs-mode processed_logprobs and honour logprobs: 0",
            )
        versions = span_versions({"weight_versions": choice.get("weight_versions")}, len(ids), submitted_version)
        return GenerateResult(ids, logprobs, _finish_reason(choice.get("finish_reason")), token_versions=versions)

    async def abort(self, rid: str | None = None) -> None:
        """Abort one request by its rid, or every request; aborted requests are not resubmitted."""
        targets = dict(self._active) if rid is None else {rid: self._active.get(rid, rid)}
        self._user_aborted.update(targets)
        await self._post("/abort_requests", {"request_ids": [f"generate-tokens-{r}" for r in targets.values()]})

    # -- weights ------------------------------------------------------------------------------------
    async def pause(self, mode: str | None = None) -> None:
        """POST /pause (abort: in-flight requests return and are resubmitted on resume; keep; wait)."""
        chosen = PAUSE_MODES.get(mode or self.pause_mode)
        if chosen is None:
            raise EngineError(f"unknown pause mode {mode!r}", hint=f"use one of {', '.join(PAUSE_MODES)}")
        await self._post("/pause", params={"mode": chosen})

    async def resume(self) -> None:
        """POST /resume."""
        await self._post("/resume")

    async def update_weights(self, path_or_state: Any, version: int | None = None) -> None:
        """Load new weights (a directory of safetensors the server can read, or a state dict written to /dev/shm
        first) between pause and resume; tokens sampled from then on carry `version`."""
        version = self.version + 1 if version is None else int(version)
        async with self._push_lock:
            started = time.perf_counter()
            written: Path | None = None
            if isinstance(path_or_state, Mapping) and self.weight_server is not None:
                url = await self.weight_server.publish(version, path_or_state)
                rpc = {"method": "envhub_fetch_weights", "kwargs": {"url": url, "token": self.weight_server.token}}
                source = url
            elif isinstance(path_or_state, (str, Path, Mapping)):
                if isinstance(path_or_state, Mapping):
                    written = await asyncio.to_thread(write_safetensors, path_or_state)
                path = written or Path(path_or_state)
                # a failed in-place reload leaves vLLM's model unusable: refuse before it starts
                check_weights_dir(path)
                rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
                source = str(path)
            else:
                raise EngineError(
                    "update_weights takes a directory of safetensors or a state dict",
                    hint="save the policy with save_pretrained(dir) and pass the directory",
                )
            try:
                timing = await self._reload(rpc, source, version, time.perf_counter() - started)
            finally:
                if written is not None:
                    await asyncio.to_thread(shutil.rmtree, written, True)
            timing.total_s = time.perf_counter() - started
            self.pushes.append(timing)
            self.version = version

    async def _reload(self, rpc: dict[str, Any], source: str, version: int, write_s: float) -> PushTiming:
        t0 = time.perf_counter()
        await self.pause()
        t1 = time.perf_counter()
        try:
            reply = await self._post("/collective_rpc", rpc)
            if not isinstance(reply, dict) or "results" not in reply:
                raise EngineError(f"{rpc['method']} from {source} answered {reply}")
        except EngineError as exc:
            if self.server is not None:  # its weights are half-loaded: stop it so no request hangs or gets garbage
                await asyncio.to_thread(self.server.stop)
                raise EngineError(
                    f"vLLM failed to load weights from {source}; the server was stopped (an in-place reload that "
                    f"fails leaves the model unusable): {exc}",
                    hint="check the weight names and shapes against the served model",
                ) from exc
            await self.resume()
            raise
        try:
            await self._post("/update_weight_version", {"new_version": str(version)})
            await self._post("/reset_prefix_cache")  # KV cached under the old weights must not be reused
            t2 = time.perf_counter()
        finally:
            await self.resume()
        t3 = time.perf_counter()
        return PushTiming(version, write_s, t1 - t0, t2 - t1, t3 - t2, t3 - t0, 0.0)

    async def check_weight_fetch(self) -> None:
        """EngineError naming the fix unless the server runs envhub's worker extension (weights over HTTP)."""
        from envhub.trainer.engines.vllm.command import EXTENSION_CLS, EXTENSION_DIR

        try:
            reply = await self._post("/collective_rpc", {"method": "envhub_extension"})
        except EngineError as exc:
            raise EngineError(
                f"the vLLM server at {self.url} cannot fetch weights over HTTP (engine.weight_sync: http): {exc}",
                hint=f"start it with --worker-extension-cls {EXTENSION_CLS} and {EXTENSION_DIR} on its PYTHONPATH "
                "(envhub serve-engine --backend vllm --rl-routes does both)",
            ) from exc
        if not isinstance(reply, dict) or not reply.get("results"):
            raise EngineError(f"the vLLM server at {self.url} answered {reply} to envhub_extension")

    async def weight_version(self) -> str:
        """The server's current weight-version label (GET /weight_info)."""
        status, payload = await self._request("GET", "/weight_info")
        if status != 200 or not isinstance(payload, dict):
            raise EngineError(f"/weight_info answered {status}: {payload}")
        return str(payload.get("weight_version"))

    async def health(self) -> bool:
        """True when the (managed) server runs and GET /health answers 200."""
        if self.server is not None and self.server.returncode is not None:
            return False
        try:
            async with self._client().get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as response:
                return response.status == 200
        except (*_CONNECTION_ERRORS, OSError):
            return False


def _finish_reason(value: Any) -> FinishReason:
    if value in ("stop", "length", "abort"):
        return value
    raise EngineError(f"vLLM finished a request with {value!r}", hint="see the server log")


def _message(payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload.get("message")))
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error is not None:
            return str(error)
    return str(payload)[:500]
