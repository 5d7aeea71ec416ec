"""Offline model loading (SmolLM2 GGUF, local dirs, tiny models), device choice, and the real-model smoke tests."""

from __future__ import annotations

import pytest

from envhub.errors import EngineError
from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.engine import EmbeddedEngine
from envhub.trainer.models import load_model, pick_device, pick_dtype, resolve_model_path, smollm2_gguf

torch = pytest.importorskip("torch")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def chat_ids(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_device_and_dtype_choice():
    device = pick_device()
    assert device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_dtype(torch.device("cpu")) == torch.float32
    assert pick_device("cpu").type == "cpu"


def test_smollm2_gguf_is_found_and_bad_paths_are_explained(tmp_path):
    directory, name = smollm2_gguf()
    assert (directory / name).is_file() and name.endswith(".gguf")
    with pytest.raises(EngineError, match="not a model directory"):
        resolve_model_path(str(tmp_path))


def test_local_model_directory_round_trip(tmp_path, tiny_model, tokenizer):
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, loaded_tokenizer = load_model(str(tmp_path), device="cpu")
    assert len(loaded_tokenizer) == len(tokenizer)
    for (name, a), (_, b) in zip(model.state_dict().items(), tiny_model.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.slow
async def test_smollm2_answers_seven_plus_five():
    engine = EmbeddedEngine.from_pretrained("smollm2", device="cpu")
    try:
        result = await engine.generate(
            chat_ids(engine.tokenizer, "What is 7+5?"), SamplingParams(max_new_tokens=40, temperature=0)
        )
        assert "12" in engine.tokenizer.decode(result.output_ids)
        assert result.finish_reason == "stop" and all(lp <= 0 for lp in result.logprobs)
    finally:
        await engine.close()


@pytest.mark.gpu
@cuda
async def test_cuda_engine_bf16_logprobs_match_recomputation(tokenizer):
    from envhub.trainer.models import tiny_llama

    model = tiny_llama(tokenizer, seed=0).to("cuda", torch.bfloat16)
    engine = EmbeddedEngine(model, tokenizer)
    try:
        prompt = tokenizer.encode("Hello there")
        result = await engine.generate(prompt, SamplingParams(max_new_tokens=16, temperature=0.0))
        with torch.no_grad():
            logits = (
                model(torch.tensor([prompt + result.output_ids], device="cuda")).logits[0, len(prompt) - 1 : -1].float()
            )
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(result.output_ids, device="cuda")[:, None])[
            :, 0
        ]
        assert result.logprobs == pytest.approx(expected.tolist(), abs=5e-2)
        assert engine.model.device.type == "cuda"
    finally:
        await engine.close()


@pytest.mark.gpu
@pytest.mark.slow
@cuda
async def test_smollm2_on_cuda_answers_seven_plus_five():
    engine = EmbeddedEngine.from_pretrained("smollm2")
    try:
        assert engine.model.dtype == torch.bfloat16
        result = await engine.generate(
            chat_ids(engine.tokenizer, "What is 7+5?"), SamplingParams(max_new_tokens=40, temperature=0)
        )
        assert "12" in engine.tokenizer.decode(result.output_ids)
    finally:
        await engine.close()
