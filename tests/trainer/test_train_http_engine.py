"""Training against an engine behind SGLang's HTTP API (envhub's compatible server): weights go by disk."""

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.trainer.config import config_from_dict
from envhub.trainer.train import Trainer

sglang_engine = pytest.importorskip("envhub.trainer.engines.sglang.client")
REPO = Path(__file__).resolve().parents[2]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tiny_server(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "envhub.cli.main",
            "serve-engine",
            "--model",
            "tiny",
            "--port",
            str(port),
            "--device",
            "cpu",
            # the learner's dtype (fp32, below): "auto" serves bf16 on CPUs with bf16 units (AMX), whose logprobs
            # differ from an fp32 forward by 0.013 per token on average (k3 KL 1.3e-4), so ratios would not start at 1
            "--dtype",
            "float32",
            "--allow-weights-dir",
            str(tmp_path),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    yield f"http://127.0.0.1:{port}", proc
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.slow
async def test_training_pushes_weights_to_an_http_engine(tiny_server, tmp_path):
    url, proc = tiny_server
    client = sglang_engine.SGLangEngine(url)
    for _ in range(300):
        if proc.poll() is not None:
            pytest.fail(proc.stderr.read())
        try:
            if await client.health():
                break
        except Exception:
            pass
        await asyncio.sleep(0.2)
    config = config_from_dict(
        {
            "model": {"name": "tiny", "device": "cpu", "dtype": "float32"},
            "engine": {"kind": "sglang", "url": url},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 4, "max_new_tokens": 4, "max_turns": 1},
            "algorithm": {"groups_per_step": 2, "lr": 0.01, "mode": "sync"},
            "budget": {"steps": 2, "checkpoint_every": 10},
            "out_dir": str(tmp_path),
        }
    )
    result = await Trainer(config).run()
    assert result.last_step == 2
    # the first step's trajectories were sampled by the untouched server model: ratios start at exactly 1. Measured
    # (tiny, CPU, 512 tokens): fp32 server vs fp32 forward max |dlogprob| 3.3e-6, kl_behavior 0.0 in 3 runs; a bf16
    # server gives 1.3e-4, so 1e-6 leaves fp32 op-order noise room and still catches a dtype mismatch
    assert abs(result.history[0]["learner"]["kl_behavior"]) < 1e-6
    assert await client.get_weight_version() == 2
    assert [p.name for p in (tmp_path / "weights").iterdir()] == ["v000002"]
    await client.close()
