"""SGLangEngine: an aiohttp client of SGLang 0.5.23's native HTTP API (or `envhub serve-engine`).

Weight pushes follow SGLang's rules: an update on a running server waits for every request in flight, so the
client pauses generation first (`pause_mode` retract, in_place or abort), updates, then continues; with
pause_mode "none" the update simply blocks. Every update flushes the server's prefix cache, and SGLang fails the
call when the flush is refused, which an in_place pause always causes (its batch keeps running requests), so
in_place sends `flush_cache: false` (their KV from the old weights is kept). Tensor and distributed updates run
inside a `/begin_weight_update` ... `/end_weight_update` session, in buckets; only the last bucket flushes and
names the version. Per-token versions come from `meta_info.weight_versions` spans. A request that comes back
aborted (pause mode abort, `abort_all_requests`) is resubmitted with its tokens appended under rid `<rid>/r<n>`;
`abort(rid)` aborts the attempt now on the server (SGLang ignores an abort whose exact rid is not live).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import aiohttp

from envhub.errors import EngineError, EngineUnreachable
from envhub.inference import FinishReason, GenerateResult, InferenceEngine, SamplingParams
from envhub.trainer.engines.protocol import (
    ADMIN_ROUTES,
    ROUTING_HEADER,
    bucket_fields,
    episode_key,
    on_cuda,
    send_buckets,
)
from envhub.trainer.engines.resubmit import resubmit_until_done

_RETRYABLE = (aiohttp.ClientConnectionError, asyncio.TimeoutError)
API_KEY_ENV = "ENVHUB_ENGINE_API_KEY"
DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024
PauseMode = Literal["retract", "in_place", "abort", "none"]
_PROBES = ("/health", "/ready")  # a 503 there is an answer, not a failure to retry
PROBE_RETRIES = 1  # a probe's own retries, whatever the client's (`get_json`)


def _version_number(value: Any, default: int = 0) -> int:
    """SGLang versions are strings ("default", "5", "step_5"); envhub's are integers (trailing digits, else default)."""
    if isinstance(value, int):
        return value
    match = re.search(r"(\d+)$", str(value)) if value is not None else None
    return int(match.group(1)) if match else default


def span_versions(meta: dict[str, Any], count: int, default: int) -> list[int]:
    """One version per output token from `meta_info.weight_versions` spans (else the response's weight_version)."""
    versions = [_version_number(meta.get("weight_version"), default)] * count
    for span in meta.get("weight_versions") or []:
        number = _version_number(span.get("version"), default)
        for i in range(max(0, int(span.get("start", 0))), min(count, int(span.get("end", 0)))):
            versions[i] = number
    return versions


class SGLangEngine(InferenceEngine):
    """InferenceEngine over HTTP: SGLang servers and `envhub serve-engine` speak the same subset."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 900.0,
        connect_timeout: float = 10.0,
        retries: int = 3,
        max_resubmits: int = 32,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        pause_mode: PauseMode = "retract",
        tensor_format: Literal["sglang", "safetensors"] = "sglang",
        tp_size: int = 1,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        flattened: bool = True,
    ) -> None:
        if pause_mode not in ("retract", "in_place", "abort", "none"):
            raise EngineError(f"unknown pause_mode {pause_mode!r}", hint="use retract, in_place, abort or none")
        if tensor_format not in ("sglang", "safetensors"):
            raise EngineError(f"unknown tensor_format {tensor_format!r}", hint="use sglang or safetensors")
        if tp_size < 1:
            raise EngineError(f"tp_size must be at least 1, got {tp_size}")
        self.url = url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        self.admin_api_key = admin_api_key or None
        self.pause_mode = pause_mode
        self.tensor_format = tensor_format
        self.tp_size = tp_size
        self.bucket_bytes = bucket_bytes
        self.flattened = flattened
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self.retries = retries
        self.max_resubmits = max_resubmits
        self.version = 0
        self._session: aiohttp.ClientSession | None = None
        self._user_aborted: set[str] = set()
        self._live: dict[str, str] = {}  # rid -> the rid of its attempt now on the server
        self._paused = False

    @property
    def flush_after_update(self) -> bool:
        """Whether updates ask the server to flush its prefix cache (not under an in_place pause)."""
        return self.pause_mode != "in_place"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout, connector=aiohttp.TCPConnector(limit=0))
        return self._session

    def _headers(self, path: str, extra: dict[str, str] | None) -> dict[str, str]:
        key = self.admin_api_key if self.admin_api_key and path in ADMIN_ROUTES else self.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return headers | (extra or {})

    async def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        *,
        retries: int | None = None,
    ) -> tuple[int, Any]:
        """Send one request, retrying connection failures and 5xx answers (`retries` times, else the client's);
        returns (status, JSON or text)."""
        last: Exception | None = None
        for attempt in range((self.retries if retries is None else retries) + 1):
            if attempt:
                await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
            try:
                async with self._client().request(
                    method, self.url + path, json=body, headers=self._headers(path, headers)
                ) as response:
                    payload: Any = (
                        await response.json() if response.content_type == "application/json" else await response.text()
                    )
                    if response.status in (401, 403):
                        admin = path in ADMIN_ROUTES
                        raise EngineError(
                            f"{self.url}{path} answered {response.status} {response.reason}",
                            hint=f"set engine.admin_api_key to the server's --admin-api-key ({path} is an admin route)"
                            if admin
                            else f"set engine.api_key (or {API_KEY_ENV}) to the server's --api-key",
                        )
                    if response.status >= 500 and path not in _PROBES:
                        last = EngineError(f"{path} answered {response.status}: {payload}")
                        continue
                    return response.status, payload
            except _RETRYABLE as exc:
                last = exc
        # a server that answered (5xx) failed the request; one that never answered is an outage
        raise (EngineError if isinstance(last, EngineError) else EngineUnreachable)(
            f"cannot reach the inference server at {self.url}{path}: {type(last).__name__}: {last}",
            hint="is it running? start one with `envhub serve-engine`, or let the trainer launch SGLang",
        )

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        """POST; EngineError for a 4xx/5xx answer or `success: false`."""
        status, payload = await self._request("POST", path, body, headers)
        if status >= 400 or (isinstance(payload, dict) and payload.get("success") is False):
            error = payload.get("error") if isinstance(payload, dict) else None
            message = (
                error.get("message")
                if isinstance(error, dict)
                else (payload.get("message") if isinstance(payload, dict) else payload)
            )
            raise EngineError(f"{path} failed ({status}): {message}")
        return payload

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, *, rid: str | None = None
    ) -> GenerateResult:
        """Generate with logprobs; requests aborted by pauses or weight updates are resubmitted where they stopped."""
        key = episode_key.get()
        headers = {ROUTING_HEADER: key} if key else None  # sglang-router's manual policy pins the episode

        async def submit(request_id: str, token_ids: list[int], segment_sampling: SamplingParams) -> GenerateResult:
            body = {
                "input_ids": token_ids,
                "sampling_params": segment_sampling.to_sglang(),
                "return_logprob": True,
                "logprob_start_len": -1,
                "rid": request_id,
                "stream": False,
            }
            meta = (await self._post("/generate", body, headers))["meta_info"]
            segment = meta.get("output_token_logprobs") or []
            finish: FinishReason = (meta.get("finish_reason") or {}).get("type") or "length"
            return GenerateResult(
                output_ids=[int(entry[1]) for entry in segment],
                logprobs=[float(entry[0]) for entry in segment],
                finish_reason=finish,
                token_versions=[int(v) for v in span_versions(meta, len(segment), 0)],  # "default" = initial weights
            )

        return await resubmit_until_done(
            submit,
            rid,
            input_ids,
            sampling,
            max_resubmits=self.max_resubmits,
            live=self._live,
            user_aborted=self._user_aborted,
            version=self.version,
        )

    # -- weight updates -------------------------------------------------------------------------------------------
    async def update_weights(
        self, path_or_state: Any, version: int | None = None, *, abort_all_requests: bool = False
    ) -> None:
        """Push weights: a directory the server may read (`/update_weights_from_disk`) or a state dict
        (`/update_weights_from_tensor`, in buckets), between pause and continue. The version is sent as a string."""
        if isinstance(path_or_state, Mapping):
            await self._pausing(
                lambda: self._in_session(lambda: self._send_tensors(path_or_state, version, abort_all_requests))
            )
        elif isinstance(path_or_state, (str, Path)):
            (fields,) = bucket_fields(1, version, self.flush_after_update, abort_all_requests)
            body = {"model_path": str(path_or_state), **fields}
            await self._pausing(lambda: self._post("/update_weights_from_disk", body))
        else:
            raise EngineError(
                "update_weights takes a checkpoint directory or a state dict",
                hint="save the policy with save_pretrained(dir) and pass the directory",
            )
        self.version = await self.get_weight_version() if version is None else version

    async def _send_tensors(self, state: Mapping[str, Any], version: int | None, abort_all: bool) -> None:
        from envhub.trainer.engines import weight_sync

        buckets = weight_sync.plan_buckets(state, self.bucket_bytes)
        for bucket, fields in zip(buckets, bucket_fields(len(buckets), version, self.flush_after_update, abort_all)):
            if self.tensor_format == "sglang":
                bucket = on_cuda(bucket)  # kept alive until the server has opened its IPC handles
                payloads = await asyncio.to_thread(
                    weight_sync.encode_sglang, bucket, self.tp_size, flattened=self.flattened
                )
                load_format = "flattened_bucket" if self.flattened else None
            else:
                payloads = [await asyncio.to_thread(weight_sync.encode_safetensors, dict(bucket))] * self.tp_size
                load_format = None
            body = {"serialized_named_tensors": payloads, "load_format": load_format, **fields}
            await self._post("/update_weights_from_tensor", body)

    async def _pausing(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run `call` between pause(pause_mode) and continue, so rollouts never queue behind the update."""
        if self.pause_mode != "none":
            await self.pause(self.pause_mode)
        try:
            return await call()
        finally:
            if self.pause_mode != "none":
                await self.resume()

    async def _in_session(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run `call` inside a weight-update session (SGLang refuses tensor and distributed updates outside one)."""
        try:
            await self._post("/begin_weight_update", {"selector": "all"})
        except EngineError as exc:
            if "already open" not in str(exc):
                raise
            await self._post("/end_weight_update", {})  # left open by an interrupted push
            await self._post("/begin_weight_update", {"selector": "all"})
        try:
            return await call()
        finally:
            await self._post("/end_weight_update", {})

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        backend: str = "nccl",
        group_name: str = "weight_update_group",
    ) -> None:
        """Ask the server to join the trainer's process group as ranks rank_offset .. rank_offset + tp_size - 1
        (the trainer is rank 0 and must join at the same time: see `protocol.join_weight_group`)."""
        await self._post(
            "/init_weights_update_group",
            {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": rank_offset,
                "world_size": world_size,
                "group_name": group_name,
                "backend": backend,
            },
        )

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        """Ask the server to leave the process group."""
        await self._post("/destroy_weights_update_group", {"group_name": group_name})

    async def update_weights_from_distributed(
        self, named: Mapping[str, Any], group: Any, version: int | None = None, *, broadcast: bool = True
    ) -> None:
        """Load `named` over `group` (a weight_sync.WeightGroup): the server receives bucket by bucket while rank
        0 broadcasts them (`broadcast=False`: another caller broadcasts once for several servers)."""
        from envhub.trainer.engines import weight_sync

        buckets = weight_sync.plan_buckets(named, self.bucket_bytes)

        async def receive() -> None:
            fields = bucket_fields(len(buckets), version, self.flush_after_update, False)
            for bucket, extra in zip(buckets, fields):
                body = {
                    "names": [name for name, _ in bucket],
                    "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                    "shapes": [list(t.shape) for _, t in bucket],
                    "group_name": group.name,
                    "load_format": "flattened_bucket" if self.flattened else None,
                    **extra,
                }
                await self._post("/update_weights_from_distributed", body)

        calls: list[Awaitable[Any]] = [self._pausing(lambda: self._in_session(receive))]
        if broadcast:
            calls.append(asyncio.to_thread(send_buckets, group, buckets, self.flattened))
        await asyncio.gather(*calls)
        self.version = await self.get_weight_version() if version is None else version

    # -- control --------------------------------------------------------------------------------------------------
    async def model_info(self) -> dict[str, Any]:
        """GET /model_info (SGLang's model path, served name and weight_version string)."""
        status, payload = await self._request("GET", "/model_info")
        if status != 200 or not isinstance(payload, dict):
            raise EngineError(f"/model_info answered {status}: {payload}")
        return payload

    async def get_weight_version(self) -> int:
        """The server's weight version (from /model_info) as an envhub integer."""
        return _version_number((await self.model_info()).get("weight_version"), self.version)

    async def pause(self, mode: str = "abort") -> None:
        """POST /pause_generation (abort, retract or in_place); aborted requests come back and are resubmitted."""
        await self._post("/pause_generation", {"mode": mode})
        self._paused = True

    async def resume(self) -> None:
        """POST /continue_generation."""
        await self._post("/continue_generation", {})
        self._paused = False

    def mark_aborted(self, rid: str | None) -> dict[str, Any]:
        """Stop resubmitting `rid` (or every request of this client); the /abort_request body that reaches it."""
        if rid is None:
            self._user_aborted.update(self._live)
            return {"abort_all": True}
        self._user_aborted.add(rid)
        return {"rid": self._live.get(rid, rid)}

    async def abort(self, rid: str | None = None) -> None:
        """Abort one request by rid (its attempt now on the server), or all requests; they are not resubmitted."""
        await self.send_abort(self.mark_aborted(rid))

    async def send_abort(self, body: dict[str, Any]) -> None:
        """POST /abort_request with a body from `mark_aborted` (of this or another client of the same requests)."""
        await self._post("/abort_request", body)

    async def get_json(self, path: str) -> tuple[int, Any]:
        """GET `path`, asking again once after a short pause; (status, JSON or text), or (0, None) when the server
        cannot be reached.

        Not with the client's retries: a probe answers whether the server is up now. With them, a dead server's probe
        took 2.8 s (0.4 + 0.8 + 1.6 s of back-off), which stretched the outage watcher's probe period and its
        `max_outage_s` (a 1 s bound was found ~7.6 s after the server died). Asked once only, one dropped connection
        to a healthy server would count as an outage (a recovery and a weight re-push); asked twice, it costs 0.4 s."""
        try:
            return await self._request("GET", path, retries=PROBE_RETRIES)
        except EngineError:
            return 0, None

    async def probe(self, path: str) -> int:
        """GET `path` as `get_json` does; its status, or 0 when the server cannot be reached."""
        return (await self.get_json(path))[0]

    async def flush_cache(self) -> bool:
        """True when the server flushed its prefix cache (it refuses while requests run)."""
        status, _ = await self._request("POST", "/flush_cache")
        return status == 200

    async def health(self) -> bool:
        """True when the server is up: GET /ready (no generation), or, while this client has it paused (/ready
        then says 503), GET /model_info. Never /health: on a paused server it waits 20 s and marks it unhealthy."""
        status = await self.probe("/ready")
        if self._paused or status == 404:  # 404: a server without /ready
            status = await self.probe("/model_info")
        return status == 200

    async def close(self) -> None:
        """Close the HTTP session (the server keeps running)."""
        if self._session is not None:
            await self._session.close()
