"""Engine kinds are types: one registry names them, a kind defined outside envhub (counting_kind.py) runs through
`envhub train` and `envhub serve-engine` with no other edit (its Ray run: tests/trainer/rollout/test_ray.py), and
bad names are refused with the known kinds and a suggestion."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envhub.errors import ConfigError, EngineError
from envhub.inference import SamplingParams
from envhub.trainer.config import config_from_dict
from envhub.trainer.engines import EngineKind, engine_kind, engine_kinds, register_engine_kind
from envhub.trainer.engines.sglang.client import SGLangEngine
from envhub.trainer.train import Trainer
from tests.trainer.engines.test_engine_outage import _until_healthy
from tests.trainer.test_train_http_engine import free_port

COUNTING = Path(__file__).with_name("counting_kind.py")
REPO = Path(__file__).resolve().parents[3]


def tiny_config(out_dir: Path, kind: str, **extra) -> dict:
    return {
        "model": {"name": "tiny"},
        "engine": {"kind": kind},
        "tasks": [{"env": "Letters-v0"}],
        "rollout": {"group_size": 2, "max_new_tokens": 4, "max_turns": 1},
        "algorithm": {"groups_per_step": 1, "mode": "sync", "filter_zero_variance": False},
        "budget": {"steps": 1, "checkpoint_every": 10},
        "out_dir": str(out_dir),
        **extra,
    }


def test_the_bundled_kinds_and_the_local_alias():
    assert engine_kinds()[:3] == ["embedded", "sglang", "vllm"]
    assert engine_kind("local") is engine_kind("embedded") and engine_kind("embedded").in_process
    assert not engine_kind("vllm").in_process and not engine_kind("sglang").in_process
    assert config_from_dict({"tasks": [{"env": "Math-v0"}]}).engine.kind == "embedded"
    config_from_dict({"tasks": [{"env": "Math-v0"}], "engine": {"kind": "local"}})  # configs in the wild


@pytest.mark.parametrize(
    ("name", "says"),
    [("vlm", "did you mean 'vllm'"), ("lokal", "did you mean 'local'"), ("tensorrt", "--import MODULE")],
)
def test_an_unknown_kind_names_the_known_ones_and_the_fix(name, says):
    with pytest.raises(ConfigError, match="unknown engine kind") as caught:
        config_from_dict({"tasks": [{"env": "Math-v0"}], "engine": {"kind": name}})
    assert "embedded, sglang, vllm" in str(caught.value) and says in caught.value.hint


def test_a_kind_needs_a_usable_name_that_is_not_taken():
    class Nameless(EngineKind):
        pass

    class Impostor(EngineKind):
        name = "vllm"

    class Alias(EngineKind):
        name = "local"

    class Shadow(EngineKind):
        name = "sglang"  # a bundled kind is taken before its module is imported, too

    for kind in (Nameless, Impostor, Alias, Shadow):
        with pytest.raises(ConfigError):
            register_engine_kind(kind)
    assert [type(engine_kind(n)).__name__ for n in ("vllm", "sglang")] == ["VLLMKind", "SGLangKind"]


def test_a_kind_refuses_what_it_cannot_do():
    with pytest.raises(ConfigError, match="for kind: sglang, not kind: embedded"):
        config_from_dict({"tasks": [{"env": "Math-v0"}], "engine": {"kind": "embedded", "router_url": "http://x"}})

    class NoWorkers(EngineKind):
        name = "no-workers"

    with pytest.raises(EngineError, match="Ray rollouts with engine.kind no-workers are not supported"):
        asyncio.run(NoWorkers().worker_endpoint(None, host="h", bind="b", api_key=None))
    assert not NoWorkers().serves_workers() and all(engine_kind(k).serves_workers() for k in ("embedded", "vllm"))
    with pytest.raises(EngineError, match="cannot serve engine kind sglang") as caught:
        engine_kind("sglang").serve(None)
    assert "--backend embedded or vllm" in caught.value.hint


def test_a_kind_from_a_configs_imports_is_checked_once_imported(tmp_path):
    config = config_from_dict(tiny_config(tmp_path, "counting-later", imports=[str(COUNTING)]))  # not imported yet
    with pytest.raises(ConfigError, match="unknown engine kind 'counting-later'"):
        asyncio.run(Trainer(config).run())


def test_envhub_train_runs_a_kind_defined_outside_envhub(tmp_path):
    config = tmp_path / "counting.yaml"
    config.write_text(json.dumps(tiny_config(tmp_path / "run", "counting")))  # JSON is YAML
    command = [sys.executable, "-m", "envhub.cli.main", "train", str(config), "--import", str(COUNTING)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    calls = re.search(r"counting kind: (\d+) generate calls", done.stdout)
    assert calls and int(calls.group(1)) >= 2, done.stdout[-2000:]  # one group of two episodes, one turn each
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == [1]


@pytest.mark.slow
def test_envhub_serve_engine_serves_a_kind_defined_outside_envhub():
    port = free_port()
    command = [sys.executable, "-m", "envhub.cli.main", "serve-engine", "--import", str(COUNTING)]
    proc = subprocess.Popen(
        [*command, "--backend", "counting", "--model", "tiny", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        result = asyncio.run(_generate_when_ready(f"http://127.0.0.1:{port}", proc))
        assert len(result.output_ids) == 3 and len(result.logprobs) == 3
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert f"counting kind: serving tiny at http://127.0.0.1:{port}" in out
    assert "registered no env" not in err  # a module that registers an engine kind is not warned about


async def _generate_when_ready(url: str, proc: subprocess.Popen) -> Any:
    """Greedy ids and logprobs of three tokens, through envhub's SGLang client, once the server is up."""
    client = SGLangEngine(url, retries=0, connect_timeout=2)
    try:
        await _until_healthy(url, proc)
        return await client.generate([1, 2, 3], SamplingParams(max_new_tokens=3, ignore_eos=True, temperature=0))
    finally:
        await client.close()
