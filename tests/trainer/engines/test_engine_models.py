"""Offline model loading (SmolLM2 GGUF, local dirs, tiny models), device choice, and the real-model smoke tests."""

from __future__ import annotations

import asyncio

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


@pytest.mark.gpu
@cuda
async def test_cuda_graph_captures_survive_a_learner_working_on_another_thread(tokenizer):
    """The trainer's process: the engine captures decode graphs while the learner's thread allocates, multiplies,
    back-propagates and syncs on the same GPU (trainer/run/graph_capture.py). Seen on an H200: in global capture mode
    this failed the engine; in thread-local mode without the lock, the learner's random numbers failed, and a
    device-wide sync outside the lock failed the engine again."""
    import threading

    from envhub.trainer.models import tiny_llama
    from envhub.trainer.run.graph_capture import CAPTURE_LOCK

    model = tiny_llama(tokenizer, seed=0).to("cuda", torch.bfloat16)
    engine = EmbeddedEngine(model, tokenizer)
    stop, failures, learner_steps = threading.Event(), [], [0]

    def learner() -> None:
        size = 256
        while not stop.is_set():
            try:
                with CAPTURE_LOCK:  # as the learner's forward/backward, which may draw random numbers
                    weight = torch.randn(size, size, device="cuda", requires_grad=True)
                    loss = (torch.randn(size, size, device="cuda") @ weight).square().mean()
                    loss.backward()
                # as its optimizer step and statistics: fresh allocations, copies and `.item()`, outside the lock
                update = torch.empty(size, size, device="cuda").copy_(weight.grad).mul_(-0.1)
                assert torch.isfinite(update).all().item()
                with CAPTURE_LOCK:  # a device-wide sync invalidates a capture on any thread
                    torch.cuda.synchronize()
                learner_steps[0] += 1
                size = 256 + (size * 7) % 1536
            except BaseException as exc:  # the test reports whatever the thread met
                failures.append(exc)
                return

    thread = threading.Thread(target=learner, daemon=True)
    thread.start()
    try:
        prompts = [tokenizer.encode("word " * (1 + 37 * i % 300)) for i in range(24)]  # many batch and width buckets
        for start in range(0, len(prompts), 6):
            results = await asyncio.gather(
                *(
                    engine.generate(p, SamplingParams(max_new_tokens=8 + 9 * j, temperature=0.0))
                    for j, p in enumerate(prompts[start : start + 6])
                )
            )
            assert all(r.output_ids and all(lp <= 0 for lp in r.logprobs) for r in results)
    finally:
        stop.set()
        thread.join(timeout=30)
        await engine.close()
    assert not failures, failures
    assert engine.decode_step.captures >= 4 and learner_steps[0] > 0, (engine.decode_step.captures, learner_steps)
