"""`envhub train --dry-run`: the shipped GPU recipes pass on a stated machine, and each refusal (memory, an engine
this machine cannot start, attached engines that do not answer, a KV cache too small) names its number and fix."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from envhub.cli.main import main
from envhub.trainer.config import config_from_dict
from envhub.trainer.engines.launcher import free_port
from envhub.trainer.placement.machine import Machine
from envhub.trainer.placement.placement import plan_placement

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
GIB = 2**30


def dry_run(capsys, *args):
    """(exit code, stdout) of `envhub train --dry-run ARGS`."""
    code = main(["train", "--dry-run", *map(str, args)])
    return code, capsys.readouterr().out


def recipe(name, tmp_path, **changes):
    """A shipped config with some top-level sections changed, written to tmp_path."""
    data = yaml.safe_load((CONFIGS / name).read_text())
    for section, values in changes.items():
        data[section] = {**(data.get(section) or {}), **values}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_one_gpu_recipe_fits_an_80_gib_gpu(capsys):
    code, out = dry_run(capsys, CONFIGS / "qwen2.5-1.5b-1gpu.yaml", "--json")
    placement = json.loads(out)
    assert code == 0 and placement["refusals"] == []
    assert placement["shape_source"] == "envhub's table (Qwen2.5-1.5B)" and placement["params"] == 1543714304
    gpu0 = placement["gpu_use"]["0"]
    assert set(gpu0) == {"trainer: learner rank 0, rollouts, queue", "embedded engine"}
    assert 40 * GIB < sum(gpu0.values()) < 80 * GIB
    (kv,) = placement["kv"]
    assert kv["bytes_per_token"] == 28672 and kv["tokens"] > 500_000


def test_the_eight_gpu_recipe_puts_the_learner_on_0_3_and_sglang_on_4_7(capsys):
    code, out = dry_run(capsys, CONFIGS / "qwen2.5-7b-8gpu.yaml", "--json")
    placement = json.loads(out)
    assert code == 0 and placement["refusals"] == [] and placement["strategy"] == "fsdp over 4 GPUs"
    by_gpu = {int(g): list(users) for g, users in placement["gpu_use"].items()}
    assert sorted(by_gpu) == list(range(8))
    assert by_gpu[1] == ["learner rank 1"] and by_gpu[4] == ["sglang-0"] and by_gpu[7] == ["sglang-3"]
    assert all(sum(users.values()) < 80 * GIB for users in placement["gpu_use"].values())
    assert any("not checked here" in note for note in placement["notes"])  # planned from a machine without CUDA


def test_text_report_names_processes_memory_and_verdict(capsys):
    code, out = dry_run(capsys, CONFIGS / "qwen2.5-7b-8gpu.yaml")
    assert code == 0 and "learner: fsdp over 4 GPUs" in out and "GPU 4:" in out and "sglang-router" in out
    assert "bytes/token" in out and out.strip().endswith("dry run: ok, nothing started")


def test_a_gpu_too_small_is_refused_with_the_number_and_the_fix(capsys):
    code, out = dry_run(capsys, CONFIGS / "qwen2.5-1.5b-1gpu.yaml", "--gpu-memory-gib", 24)
    assert code == 1
    refusal = next(line for line in out.splitlines() if line.startswith("REFUSED: GPU 0 needs"))
    assert "of 24.0 GiB" in refusal and "model.lora.r: 16" in refusal and "engine.kv_cache_mb" in refusal


def test_too_many_learner_devices_and_servers_past_the_last_gpu_are_refused(tmp_path):
    config = config_from_dict(yaml.safe_load((CONFIGS / "qwen2.5-7b-8gpu.yaml").read_text()))
    placement = plan_placement(config, Machine(gpus=4, gpu_memory=80 * GIB, host_memory=0, described=True))
    text = "\n".join(placement.refusals)
    assert "sglang-0 needs GPU 4 but the machine has 4 GPU(s)" in text and "engine.launch.base_gpu_id" in text
    config.learner.devices = 6
    placement = plan_placement(config, Machine(gpus=4, gpu_memory=80 * GIB, host_memory=0, described=True))
    assert any("learner.devices is 6 but the machine has 4 GPU(s)" in r for r in placement.refusals)


def test_a_learner_and_a_server_sharing_a_gpu_are_refused(tmp_path, capsys):
    path = recipe("qwen2.5-7b-8gpu.yaml", tmp_path)
    data = yaml.safe_load(path.read_text())
    data["engine"]["launch"]["base_gpu_id"] = 2  # servers on 2-5: GPUs 2 and 3 also hold learner ranks
    path.write_text(yaml.safe_dump(data))
    code, out = dry_run(capsys, path)
    assert code == 1 and "REFUSED: GPU 2 needs" in out and "base_gpu_id past the learner's GPUs" in out


def test_sglang_launch_is_refused_on_a_machine_without_cuda(capsys):
    code, out = dry_run(capsys, CONFIGS / "qwen2.5-7b-8gpu.yaml", "--gpus", 0)
    assert code == 1 and "engine.kind sglang cannot start here" in out and "needs CUDA GPUs" in out


def test_vllm_launch_without_its_venv_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("ENVHUB_VLLM_PYTHON", "/nonexistent/python")
    code, out = dry_run(capsys, CONFIGS / "ci-tiny-vllm.yaml")
    assert code == 1 and "engine.kind vllm cannot start here" in out and "ENVHUB_VLLM_PYTHON" in out


def test_ray_workers_with_an_engine_they_cannot_reach_are_refused(capsys):
    from envhub.trainer.engines.kinds import EngineKind, register_engine_kind

    class NoWorkers(EngineKind):  # serves in-process, but has no endpoint for workers in other processes
        name = "no-workers-for-dry-run"
        in_process = True

    register_engine_kind(NoWorkers)
    config = config_from_dict({**yaml.safe_load((CONFIGS / "ci-tiny.yaml").read_text()),
                               "engine": {"kind": NoWorkers.name}})  # fmt: skip
    machine = Machine(gpus=0, gpu_memory=0, host_memory=64 * GIB)
    refusals = plan_placement(config, machine, ray="local").refusals
    (refusal,) = refusals
    assert refusal.startswith(f"Ray rollout workers cannot reach engine.kind {NoWorkers.name}")
    assert "drop --ray" in refusal
    assert plan_placement(config, machine).refusals == []
    code, out = dry_run(capsys, CONFIGS / "ci-tiny.yaml", "--ray", "local", "--ray-workers", 3)
    assert code == 0 and "3 EnvWorker actors on a local Ray cluster" in out


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path in ("/model_info", "/health") else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def healthy_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_attached_engines_are_probed_and_a_router_with_none_healthy_is_refused(tmp_path, capsys, healthy_url):
    dead, other = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    engine = {"kind": "sglang", "url": f"{dead},{other}", "router_url": healthy_url}
    code, out = dry_run(capsys, recipe("ci-tiny.yaml", tmp_path, engine=engine))
    assert code == 1 and f"the router at {healthy_url} has no healthy engine: none of 2 server(s)" in out
    engine["url"] = f"{dead},{healthy_url}"
    code, out = dry_run(capsys, recipe("ci-tiny.yaml", tmp_path, engine=engine))
    assert code == 0 and f"sglang-0 at {dead}: cannot reach it" in out and "the others answer" in out
    engine["router_url"] = dead
    code, out = dry_run(capsys, recipe("ci-tiny.yaml", tmp_path, engine=engine))
    assert code == 1 and "start the router, or correct engine.router_url" in out


def test_a_kv_cache_shorter_than_one_episode_is_refused(tmp_path, capsys):
    path = recipe("ci-tiny.yaml", tmp_path, engine={"kv_cache_mb": 0.1, "prefix_cache_mb": 0})
    code, out = dry_run(capsys, path)
    assert code == 1 and "fewer than one episode of rollout.max_total_tokens 1024" in out
    path = recipe("qwen2.5-1.5b-1gpu.yaml", tmp_path, engine={"kv_cache_mb": 4096})  # 65 rows of 2304 tokens
    code, out = dry_run(capsys, path)
    assert code == 1 and "rows of 2304 tokens, shorter than one episode" in out and "kv_cache_mb >= 7" in out


@pytest.mark.parametrize("name", ["ci-tiny.yaml", "demo.yaml", "ci-tiny-vllm.yaml"])
def test_the_cpu_configs_pass_on_this_machine(capsys, name):
    code, out = dry_run(capsys, CONFIGS / name)
    assert code == 0, out


def test_bad_input_is_one_clear_error(tmp_path, capsys):
    path = recipe("ci-tiny.yaml", tmp_path, model={"name": "/nowhere/MyModel-3B"})
    assert main(["train", "--dry-run", str(path)]) == 2
    assert "cannot size model '/nowhere/MyModel-3B'" in capsys.readouterr().err
    assert main(["train", "--dry-run", str(CONFIGS / "qwen2.5-1.5b-1gpu.yaml"), "--gpu-memory-gib", "-1"]) == 2
    assert "--gpu-memory-gib must be >= 0" in capsys.readouterr().err
    path = recipe("ci-tiny.yaml", tmp_path, machine={"gpus": 2})
    assert main(["train", "--dry-run", str(path)]) == 2
    assert "--gpu-memory-gib 80" in capsys.readouterr().err
    assert main(["train", str(CONFIGS / "ci-tiny.yaml"), "--gpus", "8"]) == 2  # not a dry run: nothing to plan
    assert "--gpus describes a dry run" in capsys.readouterr().err


def test_a_real_run_on_gpus_is_refused_before_it_starts_when_its_placement_is(tmp_path, capsys):
    """The dry run's check runs before every GPU run too: here (no GPU) the 1-GPU recipe asks for cuda."""
    code = main(["train", str(CONFIGS / "qwen2.5-1.5b-1gpu.yaml"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "model.device is cuda but the machine has no GPU" in err and "--dry-run" in err, err
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
