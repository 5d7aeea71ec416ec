"""How long a weight push takes on each path SGLang offers, against an envhub serve-engine in another process.

    python benchmarks/weight_transfer.py [--model smollm2|tiny|DIR] [--rounds 3] [--bucket-mb 32]

Paths (the client code a training run uses, `SGLangEngine`, pause_mode retract):
- disk: the policy exported with `export_weights` to a directory, then `/update_weights_from_disk`;
- tensor: the state dict in buckets over `/update_weights_from_tensor` (base64 safetensors, serve-engine's
  format; SGLang's own format carries CUDA IPC handles instead of bytes and cannot run without a GPU);
- group (flattened / per tensor): `/update_weights_from_distributed`, the trainer broadcasting over a gloo
  process group built as SGLang builds it (the NCCL path on GPUs), one broadcast per bucket or per tensor.
Each round pushes different weights; after the last round of each path the server's greedy output must equal
the in-process model's. Writes JSON (default benchmarks/results/weight_transfer.json). CPU numbers only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.engines.protocol import join_weight_group
from envhub.trainer.engines.sglang.client import SGLangEngine
from envhub.trainer.learner.precision import export_weights
from envhub.trainer.models import load_model

GREEDY = SamplingParams(max_new_tokens=8, temperature=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def serve(model: str, weights: Path) -> tuple[subprocess.Popen, str]:
    """envhub serve-engine in a subprocess (a process group needs two processes), ready on /ready."""
    port = free_port()
    command = [sys.executable, "-m", "envhub.cli.main", "serve-engine", "--model", model, "--device", "cpu"]
    command += ["--port", str(port), "--allow-weights-dir", str(weights), "--max-body-mb", "256"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    probe = SGLangEngine(url, retries=0)
    while not await probe.health():
        if process.poll() is not None:
            raise SystemExit(process.stderr.read())
        await asyncio.sleep(0.5)
    await probe.close()
    return process, url


async def run_path(name: str, url: str, net, tokenizer, state: dict, args, weights: Path, first_version: int) -> dict:
    """`args.rounds` pushes of perturbed weights on one path; seconds per push and the check."""
    client = SGLangEngine(url, tensor_format="safetensors", bucket_bytes=int(args.bucket_mb * 2**20))
    client.flattened = name != "group-per-tensor"
    group, setup = None, 0.0
    if name.startswith("group"):
        started = time.perf_counter()
        group = await join_weight_group([client], "127.0.0.1", free_port(), "gloo", torch.device("cpu"))
        setup = time.perf_counter() - started
    times = []
    for round_ in range(args.rounds):
        with torch.no_grad():
            pushed = {n: t + 1e-3 * torch.randn_like(t) for n, t in state.items()}
        version = first_version + round_
        started = time.perf_counter()
        if name == "disk":
            path = await asyncio.to_thread(export_weights, net, weights / f"v{round_}", torch.float32, pushed)
            await client.update_weights(str(path), version=version)
        elif name == "tensor":
            await client.update_weights(pushed, version=version)
        else:
            await client.update_weights_from_distributed(pushed, group, version)
        times.append(time.perf_counter() - started)
    if group is not None:
        await client.destroy_weights_update_group()
        group.close()
    net.load_state_dict(pushed, strict=False)
    local = EmbeddedEngine(net, tokenizer)
    expected = (await local.generate([1, 2, 3], GREEDY)).output_ids
    await local.close()
    served = (await client.generate([1, 2, 3], GREEDY)).output_ids
    await client.close()
    megabytes = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    return {
        "path": name,
        "seconds_median": round(statistics.median(times), 3),
        "seconds_min": round(min(times), 3),
        "group_setup_s": round(setup, 3),
        "mb": round(megabytes, 1),
        "mb_per_s_median": round(megabytes / statistics.median(times), 1),
        "greedy_equal": served == expected,
    }


async def main(args: argparse.Namespace) -> list[dict]:
    net, tokenizer = load_model(args.model, device="cpu")
    state = {n: p.detach().clone() for n, p in net.named_parameters()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp)
        process, url = await serve(args.model, weights)
        try:
            for index, name in enumerate(("disk", "tensor", "group-flattened", "group-per-tensor")):
                row = await run_path(name, url, net, tokenizer, state, args, weights, 1 + index * args.rounds)
                print(row, flush=True)
                rows.append(row)
        finally:
            process.terminate()
            process.wait(timeout=60)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=32.0)
    parser.add_argument("--out", default="benchmarks/results/weight_transfer.json")
    arguments = parser.parse_args()
    results = asyncio.run(main(arguments))
    meta = {"model": arguments.model, "rounds": arguments.rounds, "bucket_mb": arguments.bucket_mb}
    meta |= {"machine": platform.machine(), "cpus": os.cpu_count(), "load_average": os.getloadavg()[0]}
    Path(arguments.out).write_text(json.dumps({"meta": meta, "paths": results}, indent=2) + "\n")
    print(f"wrote {arguments.out}")
