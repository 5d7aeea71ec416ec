"""SGLangEngine: an aiohttp client of SGLang's native HTTP API (or `envhub serve-engine`), plus a server launcher.

Weight pushes follow SGLang's semantics: an update on a running server waits for every request in flight, so
the client first pauses generation (`pause_mode` retract or in_place), updates, then continues; with
pause_mode "none" the update simply blocks. Per-token versions come from `meta_info.weight_versions`
spans. A request that comes back aborted (pause mode abort, or `abort_all_requests`) is resubmitted with
its tokens appended and `max_new_tokens` reduced, under rid `<rid>/r<n>` so that aborting `<rid>`
(SGLang matches rids by prefix) also reaches its resubmissions.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import sys
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import aiohttp

from envhub.errors import EngineError
from envhub.inference import FinishReason, GenerateResult, InferenceEngine, SamplingParams

_RETRYABLE = (aiohttp.ClientConnectionError, asyncio.TimeoutError)
API_KEY_ENV = "ENVHUB_ENGINE_API_KEY"
PauseMode = Literal["retract", "in_place", "abort", "none"]


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
        pause_mode: PauseMode = "retract",
        tensor_format: Literal["safetensors", "sglang"] = "safetensors",
    ) -> None:
        if pause_mode not in ("retract", "in_place", "abort", "none"):
            raise EngineError(f"unknown pause_mode {pause_mode!r}", hint="use retract, in_place, abort or none")
        self.url = url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        self.pause_mode = pause_mode
        self.tensor_format = tensor_format
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self.retries = retries
        self.max_resubmits = max_resubmits
        self.version = 0
        self.in_flight = 0
        self._session: aiohttp.ClientSession | None = None
        self._user_aborted: set[str] = set()
        self._active: set[str] = set()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, connector=aiohttp.TCPConnector(limit=0), headers=headers
            )
        return self._session

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """Send one request, retrying connection failures and 5xx answers; returns (status, JSON or text)."""
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
            try:
                async with self._client().request(method, self.url + path, json=body) as response:
                    payload: Any = (
                        await response.json() if response.content_type == "application/json" else await response.text()
                    )
                    if response.status == 401:
                        raise EngineError(
                            f"{self.url}{path} answered 401 Unauthorized",
                            hint=f"set engine.api_key (or {API_KEY_ENV}) to the server's --api-key",
                        )
                    if response.status >= 500 and path != "/health":
                        last = EngineError(f"{path} answered {response.status}: {payload}")
                        continue
                    return response.status, payload
            except _RETRYABLE as exc:
                last = exc
        raise EngineError(
            f"cannot reach the inference server at {self.url}{path}: {type(last).__name__}: {last}",
            hint="is it running? start one with `envhub serve-engine` or launch_sglang_server()",
        )

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        status, payload = await self._request("POST", path, body)
        if status >= 400:
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
        rid = rid or f"envhub-{uuid.uuid4().hex}"
        output_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish: FinishReason = "abort"
        self.in_flight += 1
        self._active.add(rid)
        try:
            for attempt in range(self.max_resubmits + 1):
                remaining = sampling.max_new_tokens - len(output_ids)
                body = {
                    "input_ids": list(input_ids) + output_ids,
                    "sampling_params": replace(sampling, max_new_tokens=remaining).to_sglang(),
                    "return_logprob": True,
                    "logprob_start_len": -1,
                    "rid": rid if attempt == 0 else f"{rid}/r{attempt}",
                    "stream": False,
                }
                data = await self._post("/generate", body)
                meta = data["meta_info"]
                segment = meta.get("output_token_logprobs") or []
                output_ids += [int(entry[1]) for entry in segment]
                logprobs += [float(entry[0]) for entry in segment]
                versions += span_versions(meta, len(segment), 0)  # "default" (no number) is the initial weights
                finish = (meta.get("finish_reason") or {}).get("type") or "length"
                if finish != "abort" or rid in self._user_aborted or len(output_ids) >= sampling.max_new_tokens:
                    break
            if finish == "abort" and len(output_ids) >= sampling.max_new_tokens:
                finish = "length"
        finally:
            self.in_flight -= 1
            self._active.discard(rid)
            self._user_aborted.discard(rid)
        return GenerateResult(
            output_ids=output_ids,
            logprobs=logprobs,
            finish_reason=finish,
            weight_version=versions[-1] if versions else self.version,
            meta={
                "rid": rid,
                "prompt_tokens": len(input_ids),
                "completion_tokens": len(output_ids),
                "resubmits": attempt,
            },
            token_versions=[int(v) for v in versions],
        )

    async def update_weights(
        self, path_or_state: Any, version: int | None = None, *, abort_all_requests: bool = False
    ) -> None:
        """Push weights: pause (unless pause_mode is "none"), load (a directory the server may read, or a state
        dict over /update_weights_from_tensor), continue. The version is sent as a string."""
        body: dict[str, Any] = {"abort_all_requests": abort_all_requests}
        if version is not None:
            body["weight_version"] = str(version)
        if isinstance(path_or_state, Mapping):
            from envhub.trainer.engines import weight_sync

            if self.tensor_format == "sglang":
                body["serialized_named_tensors"] = weight_sync.encode_sglang(path_or_state)
            else:
                body["serialized_named_tensors"] = [weight_sync.encode_safetensors(path_or_state)]
            route = "/update_weights_from_tensor"
        elif isinstance(path_or_state, (str, Path)):
            body["model_path"] = str(path_or_state)
            route = "/update_weights_from_disk"
        else:
            raise EngineError(
                "update_weights takes a checkpoint directory or a state dict",
                hint="save the policy with save_pretrained(dir) and pass the directory",
            )
        await self._paused_call(route, body)
        self.version = await self.get_weight_version() if version is None else version

    async def _paused_call(self, route: str, body: dict[str, Any]) -> Any:
        """POST `route` between pause(pause_mode) and continue, so rollouts never queue behind the update."""
        if self.pause_mode != "none":
            await self.pause(self.pause_mode)
        try:
            reply = await self._post(route, body)
        finally:
            if self.pause_mode != "none":
                await self.resume()
        if isinstance(reply, dict) and not reply.get("success", True):
            raise EngineError(f"weight update failed: {reply.get('message')}")
        return reply

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        backend: str = "nccl",
        group_name: str = "weight_update_group",
    ) -> None:
        """Ask the server to join the trainer's process group (the trainer is rank 0; call both at once)."""
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

    async def update_weights_from_distributed(
        self, named: Mapping[str, Any], group: Any, version: int | None = None, group_name: str = "weight_update_group"
    ) -> None:
        """Broadcast `named` tensors from rank 0 of `group` (a weight_sync.WeightGroup) while the server receives
        them."""
        tensors = list(named.items())
        body: dict[str, Any] = {
            "names": [n for n, _ in tensors],
            "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in tensors],
            "shapes": [list(t.shape) for _, t in tensors],
            "group_name": group_name,
        }
        if version is not None:
            body["weight_version"] = str(version)

        def send() -> None:
            for _, tensor in tensors:
                group.broadcast(tensor.detach().contiguous().to(group.device))

        await asyncio.gather(self._paused_call("/update_weights_from_distributed", body), asyncio.to_thread(send))
        self.version = await self.get_weight_version() if version is None else version

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

    async def resume(self) -> None:
        """POST /continue_generation."""
        await self._post("/continue_generation", {})

    async def abort(self, rid: str | None = None) -> None:
        """Abort one request by rid, or all requests on the server; this client does not resubmit them."""
        self._user_aborted.update(self._active if rid is None else {rid})
        await self._post("/abort_request", {"rid": rid} if rid is not None else {"abort_all": True})

    async def flush_cache(self) -> bool:
        """True when the server flushed its prefix cache (it refuses while requests run)."""
        status, _ = await self._request("POST", "/flush_cache")
        return status == 200

    async def health(self) -> bool:
        """True when GET /health answers 200."""
        try:
            status, _ = await self._request("GET", "/health")
        except EngineError:
            return False
        return status == 200

    async def close(self) -> None:
        """Close the HTTP session (the server keeps running)."""
        if self._session is not None:
            await self._session.close()


@dataclass
class SGLangServer:
    """A `python -m sglang.launch_server` subprocess and its address."""

    process: asyncio.subprocess.Process
    url: str
    log_path: Path

    async def stop(self, grace: float = 15.0) -> None:
        """Terminate the server (kill after `grace` seconds)."""
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), grace)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def sglang_command(model_path: str, host: str, port: int, **server_args: Any) -> list[str]:
    """The launch_server command line; server_args become flags (mem_fraction_static=0.7 -> --mem-fraction-static
    0.7)."""
    command = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
    ]
    for key, value in server_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value not in (None, False):
            command += [flag, str(value)]
    return command


async def launch_sglang_server(
    model_path: str, port: int = 30000, host: str = "127.0.0.1", *, startup_timeout: float = 900.0, **server_args: Any
) -> SGLangServer:
    """Start an SGLang server for `model_path` and wait until /health answers 200."""
    if importlib.util.find_spec("sglang") is None:
        raise EngineError(
            "sglang is not installed: pip install 'envhub[sglang]' on a GPU machine",
            hint="or serve the model with `envhub serve-engine` (CPU or GPU)",
        )
    log_path = Path(tempfile.mkstemp(prefix=f"sglang-{port}-", suffix=".log")[1])
    with open(log_path, "wb") as log:
        process = await asyncio.create_subprocess_exec(
            *sglang_command(model_path, host, port, **server_args), stdout=log, stderr=asyncio.subprocess.STDOUT
        )
    server = SGLangServer(process, f"http://{host}:{port}", log_path)
    client = SGLangEngine(server.url, retries=0, connect_timeout=2.0)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + startup_timeout
    try:
        while not await client.health():
            if process.returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise EngineError(f"sglang.launch_server exited with code {process.returncode}:\n{tail}")
            if loop.time() > deadline:
                await server.stop()
                raise EngineError(f"sglang server not healthy after {startup_timeout:.0f} s", hint=f"see {log_path}")
            try:
                await asyncio.wait_for(process.wait(), 1.0)  # wake early if it dies
            except TimeoutError:
                pass
    finally:
        await client.close()
    return server
