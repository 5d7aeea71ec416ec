"""Next-token sampling: restrictions pick from the right set; reported logprobs are log_softmax(logits / T)."""

from __future__ import annotations

import pytest

from envhub.inference import SamplingParams
from envhub.trainer.engines.embedded.sampler import behavior_logprobs, sample_next

torch = pytest.importorskip("torch")


def test_top_k_one_and_tiny_top_p_are_greedy_but_report_unrestricted_logprobs():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5, top_k=1),
        SamplingParams(temperature=2.0, top_p=1e-6),
    ]
    tokens, logprobs = sample_next(logits, params, [None, None, None])
    assert tokens == logits.argmax(-1).tolist()
    for row, (p, t) in enumerate(zip(params, tokens)):
        assert logprobs[row] == pytest.approx(behavior_logprobs(logits[row], p.temperature)[t].item(), abs=1e-6)


def test_samples_follow_the_tempered_distribution_within_top_k():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -5.0]])
    generator = torch.Generator().manual_seed(1)
    params = [SamplingParams(temperature=1.0, top_k=3)]
    counts = torch.zeros(5)
    for _ in range(2000):
        counts[sample_next(logits, params, [generator])[0][0]] += 1
    expected = torch.softmax(logits[0, :3], -1) * 2000
    assert counts[3:].sum() == 0
    assert torch.allclose(counts[:3], expected, rtol=0.15)


def test_penalties_follow_sglangs_definitions():
    logits = torch.tensor([[3.0, 2.9, -1.0, 0.0]] * 3)
    history = [[0], [0, 0], [0]]
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=2.0),  # 3.0 / 2 = 1.5 < 2.9
        SamplingParams(temperature=0.0, frequency_penalty=0.1),  # 3.0 - 0.2 = 2.8 < 2.9
        SamplingParams(temperature=0.0, presence_penalty=0.05),
    ]  # 3.0 - 0.05 = 2.95 > 2.9
    tokens, logprobs = sample_next(logits, params, [None] * 3, history)
    assert tokens == [1, 1, 0]
    assert logprobs[0] == pytest.approx(torch.log_softmax(logits[0], -1)[1].item(), abs=1e-6)  # unpenalised logprob
    negative = torch.tensor([[-1.0, -1.5]])
    assert sample_next(negative, [SamplingParams(temperature=0.0, repetition_penalty=2.0)], [None], [[0]])[0] == [1]


def test_min_p_min_new_tokens_and_logit_bias():
    logits = torch.tensor([[5.0, 4.0, 0.0, -3.0]])
    generator = torch.Generator().manual_seed(0)
    drawn = {sample_next(logits, [SamplingParams(temperature=1.0, min_p=0.3)], [generator])[0][0] for _ in range(300)}
    assert drawn == {0, 1}  # p(2) / p(0) = e^-5 < 0.3
    stop = sample_next(logits, [SamplingParams(temperature=0.0, min_new_tokens=2)], [None], [[7]], [{0}])[0]
    assert stop == [1]  # the stop token 0 is masked until two tokens exist
    assert sample_next(logits, [SamplingParams(temperature=0.0, logit_bias=((3, 10.0),))], [None])[0] == [3]


def test_batched_rows_draw_like_single_rows_with_their_own_generators():
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(temperature=0.9, top_p=0.8, seed=i, top_k=20) for i in range(4)]
    batched = sample_next(logits, params, [torch.Generator().manual_seed(i) for i in range(4)])[0]
    single = [
        sample_next(logits[i : i + 1], params[i : i + 1], [torch.Generator().manual_seed(i)])[0][0] for i in range(4)
    ]
    assert batched == single


def test_plain_sampling_over_many_blocks_follows_the_softmax_and_never_draws_an_impossible_token():
    """A vocabulary of several draw blocks plus a ragged tail, mass spread over blocks, some tokens at -inf."""
    vocab, likely = 1000, [3, 255, 256, 511, 700, 999]
    logits = torch.full((1, vocab), -1e4)
    logits[0, likely] = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, 1.5])
    logits[0, [4, 257, 998]] = float("-inf")
    params = [SamplingParams(temperature=0.7)] * 64
    generator_free = [None] * 64  # unseeded rows draw from torch's global generator
    torch.manual_seed(0)
    counts = torch.zeros(vocab)
    for _ in range(80):
        tokens, logprobs = sample_next(logits.expand(64, -1), params, generator_free)
        for token in tokens:
            counts[token] += 1
    expected = torch.softmax(logits[0] / 0.7, -1) * counts.sum()
    assert set(counts.nonzero().flatten().tolist()) <= set(likely)
    sigma = expected[likely].sqrt()  # binomial counts of 5120 draws; the smallest cell expects ~75
    assert ((counts[likely] - expected[likely]).abs() < 4 * sigma).all(), (counts[likely], expected[likely])
    reference = torch.log_softmax(logits[0] / 0.7, -1)
    assert logprobs == pytest.approx([reference[t].item() for t in tokens], abs=1e-5)


def test_plain_sampling_of_a_real_sized_batch_reports_log_softmax_of_each_drawn_token():
    logits = torch.randn(32, 49152, generator=torch.Generator().manual_seed(5)) * 4
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)] * 16
    tokens, logprobs = sample_next(logits, params, [torch.Generator().manual_seed(i) for i in range(32)])
    reference = torch.log_softmax(logits, -1)
    assert logprobs == pytest.approx([reference[r, t].item() for r, t in enumerate(tokens)], abs=1e-4)
    assert tokens[1::2] == logits[1::2].argmax(-1).tolist()
    again = sample_next(logits, params, [torch.Generator().manual_seed(i) for i in range(32)])[0]
    assert again == tokens  # seeded rows draw the same
