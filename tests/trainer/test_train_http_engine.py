"""Training against an engine behind SGLang's HTTP API (envhub's compatible server): weights go by disk."""

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.trainer.config import config_from_dict
from envhub.trainer.train import Trainer

sglang_engine = pytest.importorskip("envhub.trainer.engines.sglang")
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
            "model": {"name": "tiny"},
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
    # the first step's trajectories were sampled by the untouched server model: ratios start at exactly 1
    assert abs(result.history[0]["learner"]["kl_behavior"]) < 1e-4
    assert await client.get_weight_version() == 2
    assert [p.name for p in (tmp_path / "weights").iterdir()] == ["v000002"]
    await client.close()
