"""What envhub asks of vLLM without starting it: flags, environment, sampling JSON, model checks, CLI refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from envhub.errors import EngineError
from envhub.inference import SamplingParams
from envhub.trainer.engines.vllm import command as vllm_command
from envhub.trainer.engines.vllm.command import VLLMServerArgs, check_head_dim, vllm_python, vllm_sampling


def test_server_flags_give_token_route_processed_logprobs_and_no_seed_crash():
    argv = VLLMServerArgs(model="/m", port=8001, served_model_name="tiny", api_key="k", tool_template=True).argv()
    flags = " ".join(argv)
    for flag in (
        "--model /m",
        "--host 127.0.0.1",
        "--port 8001",
        "--logprobs-mode processed_logprobs",
        "--enable-scale-out",
        "--no-enable-chunked-prefill",
        "--enforce-eager",
        "--served-model-name tiny",
        "--api-key k",
        "--tool-call-parser hermes",
        "--enable-auto-tool-choice",
    ):
        assert flag in flags
    assert argv[argv.index("--chat-template") + 1].endswith("hermes_tools.jinja")
    assert "--api-key" not in VLLMServerArgs(model="/m", port=1).argv()


def test_server_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "leaked")
    monkeypatch.delenv("TORCH_COMPILE_DISABLE", raising=False)
    python = tmp_path / "venv" / "bin" / "python"
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "lib" / "libiomp5.so").touch()
    env = VLLMServerArgs(model="/m", port=1, kv_cache_gib=1.5).environment(python)
    assert env["LD_PRELOAD"].startswith(str(tmp_path / "venv" / "lib" / "libiomp5.so"))
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1.5" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_API_KEY" not in env and env["HF_HUB_OFFLINE"] == "1"
    assert VLLMServerArgs(model="/m", port=1, rl_routes=False).environment(python)["VLLM_SERVER_DEV_MODE"] == "0"
    # eager as --enforce-eager says, also the ops vLLM compiles itself (a gcc build on the first request), unless
    # the user asked for them
    assert env["TORCH_COMPILE_DISABLE"] == "1"
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "0")
    assert VLLMServerArgs(model="/m", port=1).environment(python)["TORCH_COMPILE_DISABLE"] == "0"


def test_sampling_params_as_vllm_json():
    greedy = vllm_sampling(SamplingParams(max_new_tokens=5, temperature=0.0, stop_token_ids=(2, 7)))
    assert greedy == {
        "max_tokens": 5,
        "temperature": 0.0,
        "top_p": 1.0,
        "logprobs": 0,
        "detokenize": False,
        "stop_token_ids": [2, 7],
    }
    shaped = vllm_sampling(
        SamplingParams(
            top_k=20, stop=("END",), seed=3, min_new_tokens=2, repetition_penalty=1.1, logit_bias=((5, -1.0),)
        )
    )
    assert shaped["top_k"] == 20 and shaped["stop"] == ["END"] and shaped["detokenize"] is True
    assert shaped["seed"] == 3 and shaped["min_tokens"] == 2 and shaped["repetition_penalty"] == 1.1
    assert shaped["logit_bias"] == {"5": -1.0} and "top_k" not in vllm_sampling(SamplingParams())


def test_head_dims_vllm_cpu_cannot_run_are_refused_before_starting_it():
    check_head_dim({"hidden_size": 64, "num_attention_heads": 2}, "tiny")  # head_dim 32
    check_head_dim({"hidden_size": 576, "num_attention_heads": 9, "head_dim": 64}, "smollm2")
    with pytest.raises(EngineError, match="head_dim 16 .*tiny_heads"):
        check_head_dim({"hidden_size": 64, "num_attention_heads": 4}, "tiny")


def test_missing_vllm_names_make_install(monkeypatch, tmp_path):
    monkeypatch.delenv(vllm_command.PYTHON_ENV, raising=False)
    monkeypatch.setattr(vllm_command, "_candidates", lambda: [tmp_path / ".venv-vllm" / "bin" / "python"])
    with pytest.raises(EngineError, match="vLLM is not installed.*make install"):
        vllm_python()
    monkeypatch.setenv(vllm_command.PYTHON_ENV, str(tmp_path / "nope"))
    with pytest.raises(EngineError, match="not an executable Python"):
        vllm_python()
    monkeypatch.setenv(vllm_command.PYTHON_ENV, sys.executable)
    assert str(vllm_python()) == sys.executable


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--host", "0.0.0.0"], "refusing to serve on 0.0.0.0 without an API key"),
        (["--host", "0.0.0.0", "--api-key", "k", "--rl-routes"], "refusing --rl-routes on 0.0.0.0"),
        (["--device", "cpu"], "--device is an option of --backend embedded"),
        (["--allow-weights-dir", "/tmp"], "--allow-weights-dir is an option of --backend embedded"),
    ],
)
def test_serve_engine_vllm_refuses_unsafe_or_meaningless_options(args, error, monkeypatch):
    monkeypatch.setenv(vllm_command.PYTHON_ENV, sys.executable)  # never reached: refused before starting
    command = [sys.executable, "-m", "envhub.cli.main", "serve-engine", "--backend", "vllm", "--model", "tiny"]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and error in done.stderr


def test_served_model_dir_gives_vllm_a_loadable_directory_for_every_alias(tmp_path):
    from envhub.trainer import models
    from envhub.trainer.engines.vllm.weights import served_model_dir

    tiny = served_model_dir("tiny")
    config = json.loads((tiny / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 32 and any(tiny.glob("*.safetensors"))
    smollm2 = served_model_dir("smollm2")  # the safetensors copy envhub caches (a plain Llama, no GGUF config)
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert any(smollm2.glob("*.safetensors"))
    tokenizer = models.load_tokenizer("tiny")
    models.save_model_dir(models.tiny_llama(tokenizer, seed=1, num_heads=2), tokenizer, tmp_path / "ok")
    assert served_model_dir(str(tmp_path / "ok")) == tmp_path / "ok"
    models.save_model_dir(models.tiny_llama(tokenizer, seed=1), tokenizer, tmp_path / "default-tiny")
    with pytest.raises(EngineError, match="head_dim 16"):  # refused before a server is started
        served_model_dir(str(tmp_path / "default-tiny"))
    with pytest.raises(EngineError, match="not a model directory"):
        served_model_dir(str(tmp_path / "missing"))
