"""Launching SGLang from `engine: {kind: sglang, launch: ...}`: the command lines (checked against SGLang's own
argument definitions and sglang-router's own parser), the GPU and install checks, and the config's errors.

SGLang itself cannot run here (CUDA-only kernels), so these tests stop at the command line; the router and the
launch orchestration run for real in test_sglang_router.py.
"""

from __future__ import annotations

import sys

import pytest

from envhub.errors import ConfigError, EngineError
from envhub.trainer.config import SGLangLaunchConfig, config_from_dict
from envhub.trainer.engines.sglang.launch import (
    check_gpus,
    check_installed,
    plan_launch,
    router_args,
    server_env,
)
from tests.sglang_support import server_arg_fields

BASE = {"tasks": [{"env": "Letters-v0"}]}


def _launch(**overrides):
    config = config_from_dict(
        {**BASE, "engine": {"kind": "sglang", "launch": overrides.pop("launch", {}), **overrides}}
    )
    return config.engine


def test_server_command_lines_use_sglangs_own_flags():
    engine = _launch(
        tp_size=2,
        api_key="k",
        admin_api_key="a",
        launch={
            "num_servers": 2,
            "base_gpu_id": 1,
            "port": 31000,
            "mem_fraction_static": 0.6,
            "enable_memory_saver": True,
            "skip_server_warmup": True,
            "extra_args": ["--random-seed", "7"],
        },
    )
    plan = plan_launch(engine.launch, model_path="/runs/x/weights/initial", tp_size=2, dtype="bfloat16", api_key="k")
    fields = server_arg_fields()
    first, second = (s.command for s in plan.servers)
    assert first.argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    args = list(first.args)
    for index, token in enumerate(args):
        if token.startswith("--"):
            name = token[2:].replace("-", "_")
            assert name in fields, f"{token} is not an option of SGLang 0.5.23"
            takes_value = index + 1 < len(args) and not args[index + 1].startswith("--")
            assert takes_value == (fields[name] != "bool"), f"{token}: {fields[name]}"
    values = dict(zip(args[::1], args[1:]))
    assert values["--model-path"] == "/runs/x/weights/initial" and values["--dtype"] == "bfloat16"
    assert values["--weight-version"] == "0" and values["--mem-fraction-static"] == "0.6"
    assert [s.gpus for s in plan.servers] == [(1, 2), (3, 4)]
    assert [s.url for s in plan.servers] == ["http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    assert [s.ready_url for s in plan.servers] == ["http://127.0.0.1:31000/ready", "http://127.0.0.1:31001/ready"]
    assert dict(zip(second.args, second.args[1:]))["--base-gpu-id"] == "3"
    assert plan.router is None and plan.router_url is None


def test_the_environment_drops_settings_that_change_logprobs():
    env = server_env({"PATH": "/bin", "SGLANG_RETURN_ORIGINAL_LOGPROB": "1"})
    assert env == {"PATH": "/bin", "PYTHONUNBUFFERED": "1"}


def test_router_command_line_parses_with_sglang_routers_own_parser():
    launch_router = pytest.importorskip("sglang_router.launch_router")
    engine = _launch(api_key="k", launch={"num_servers": 3, "router": {"port": 32000}})
    plan = plan_launch(engine.launch, model_path="/m", tp_size=1, dtype="float32", api_key="k")
    assert plan.router.module == "sglang_router.launch_router" and plan.router_url == "http://127.0.0.1:32000"
    parsed = launch_router.parse_router_args(list(plan.router.args))
    assert parsed.worker_urls == plan.worker_urls and parsed.port == 32000
    assert parsed.policy == "manual" and parsed.health_check_endpoint == "/ready"
    assert parsed.disable_retries and parsed.api_key == "k"
    # its metrics exporter on a port of its own (sglang-router's default, 29000, is every router's)
    assert parsed.prometheus_host == "127.0.0.1" and parsed.prometheus_port not in (29000, 32000)
    again = launch_router.parse_router_args(router_args(plan.worker_urls, "127.0.0.1", 32001, metrics_port=32002))
    assert again.prometheus_port == 32002
    with pytest.raises(ConfigError, match="router policy"):
        router_args(["http://a:1"], "127.0.0.1", 1, policy="fastest")


def test_gpu_checks_name_what_is_missing():
    plan = plan_launch(SGLangLaunchConfig(num_servers=2), model_path="/m", tp_size=2, dtype="bfloat16")
    with pytest.raises(EngineError, match="needs CUDA GPUs and this machine has none"):
        check_gpus(plan, 0)
    with pytest.raises(EngineError, match=r"needs GPUs 0\.\.3 \(2 server\(s\) x tp_size 2.*this machine has 2"):
        check_gpus(plan, 2)
    with pytest.raises(EngineError, match="trainer \\(NCCL rank 0\\) is on GPU 0"):
        check_gpus(plan, 8, trainer_gpu=0)
    check_gpus(plan, 4)
    shifted = plan_launch(SGLangLaunchConfig(num_servers=2, base_gpu_id=1), model_path="/m", tp_size=2, dtype="bf16")
    check_gpus(shifted, 5, trainer_gpu=0)


def test_missing_sglang_names_the_install_command(tmp_path):
    # this environment has SGLang's Python package (for the conformance tests) but not its CUDA kernels
    with pytest.raises(EngineError, match="SGLang is not installed") as caught:
        check_installed(sys.executable, router=True)
    assert "sgl_kernel" in str(caught.value) and "pip install sglang==0.5.23" in caught.value.hint
    assert "CUDA" in caught.value.hint
    with pytest.raises(EngineError, match="cannot run engine.launch.python"):
        check_installed(str(tmp_path / "no-python"), router=False)


async def test_launch_on_this_machine_fails_fast_with_the_fix(tmp_path):
    from envhub.trainer.engines import build_engine
    from envhub.trainer.models import load_model

    config = config_from_dict({**BASE, "engine": {"kind": "sglang", "launch": {}}, "out_dir": str(tmp_path)})
    model, tokenizer = load_model("tiny", device="cpu")
    with pytest.raises(EngineError, match="SGLang is not installed|needs CUDA GPUs"):
        await build_engine(config, model, tokenizer)
    assert not (tmp_path / "weights").exists()  # nothing exported before the checks


async def test_attaching_to_a_url_where_nothing_answers_fails_before_the_run():
    from envhub.trainer.engines import build_engine
    from envhub.trainer.engines.launcher import free_port

    url = f"http://127.0.0.1:{free_port()}"
    config = config_from_dict({**BASE, "engine": {"kind": "sglang", "url": url}})
    with pytest.raises(EngineError, match=f"engine.url {url} is not an SGLang server that answers") as caught:
        await build_engine(config, None, None)
    assert "fix engine.url" in caught.value.hint


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"kind": "sglang", "url": "http://a:1", "launch": {}}, "both launch and url"),
        ({"kind": "sglang"}, "needs engine.url .* or engine.launch"),
        ({"kind": "sglang", "launch": None}, "needs engine.url .* or engine.launch"),
        ({"kind": "local", "launch": {}}, "for kind: sglang"),
        ({"kind": "local", "weight_sync": "nccl"}, "for kind: sglang"),
        ({"kind": "vllm", "launch": {}}, "for kind: sglang, not kind: vllm"),
        ({"kind": "vllm", "weight_sync": "tensor"}, "for kind: sglang, not kind: vllm"),
        ({"kind": "sglang", "launch": {"router": {}}, "router_url": "http://r:1"}, "both launch and url"),
        ({"kind": "sglang", "launch": {"host": "0.0.0.0"}}, "without an API key"),
        ({"kind": "sglang", "launch": {"num_servers": 0}}, "num_servers must be at least 1"),
        ({"kind": "sglang", "launch": {"mem_fraction_static": 1.5}}, "mem_fraction_static"),
        ({"kind": "sglang", "url": "http://a:1", "tp_size": 0}, "tp_size must be >= 1"),
        ({"kind": "sglang", "launch": {"router": {"policy": "fastest"}}}, "policy must be one of"),
        ({"kind": "sglang", "launch": {"gpus": [0]}}, "unknown config key 'engine.launch.gpus'"),
        ({"kind": "sglang", "url": "http://a:1", "weight_sync": "rdma"}, "weight_sync must be one of"),
    ],
)
def test_engine_config_errors(engine, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({**BASE, "engine": engine})


def test_router_port_must_differ_from_the_servers():
    engine = _launch(launch={"num_servers": 2, "port": 30000, "router": {"port": 30001}})
    with pytest.raises(ConfigError, match="router.port 30001 is also a server port"):
        plan_launch(engine.launch, model_path="/m", tp_size=1, dtype="float32")


def test_attach_config_builds_a_deployment_over_every_url():
    from envhub.trainer.engines.sglang.deploy import deployment_from_config

    config = config_from_dict(
        {
            **BASE,
            "engine": {
                "kind": "sglang",
                "url": "http://a:1, http://b:2",
                "router_url": "http://r:3",
                "pause_mode": "in_place",
                "admin_api_key": "adm",
                "tp_size": 2,
                "weight_sync": "tensor",
                "bucket_mb": 1,
            },
        }
    )
    deployment = deployment_from_config(config, None, None)
    workers = deployment.workers.engines
    assert [w.url for w in workers] == ["http://a:1", "http://b:2"] and deployment.router.url == "http://r:3"
    assert {(w.pause_mode, w.admin_api_key, w.tp_size, w.bucket_bytes) for w in workers} == {
        ("in_place", "adm", 2, 1024 * 1024)
    }
    assert deployment.weight_sync == "tensor" and deployment.plan is None
