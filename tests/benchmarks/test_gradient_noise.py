"""benchmarks/gradient_noise.py: the noise-scale statistics against vectors of known signal and noise, and one run."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from envhub.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
spec = importlib.util.spec_from_file_location("gradient_noise", ROOT / "benchmarks" / "gradient_noise.py")
noise = importlib.util.module_from_spec(spec)
spec.loader.exec_module(noise)


def gram_of(signal_norm, sigma, k=40, d=4000, seed=0):
    """K gradients G + noise: |G| = signal_norm, each coordinate's noise sd `sigma` (tr Sigma = d sigma^2)."""
    gen = torch.Generator().manual_seed(seed)
    direction = torch.randn(d, generator=gen, dtype=torch.float64)
    true = signal_norm * direction / direction.norm()
    grads = true + sigma * torch.randn(k, d, generator=gen, dtype=torch.float64)
    return grads @ grads.T


def test_signal_noise_and_scale_match_vectors_of_known_make():
    gram = gram_of(1.0, 0.02, k=40, d=4000)  # |G|^2 = 1, tr Sigma = 1.6: B = 1.6 groups
    figures = noise.noise_figures(gram)
    assert abs(figures["signal_sq"] - 1.0) < 3 * figures["signal_sq_se"] and figures["signal_sq_se"] < 0.1
    assert figures["noise_sq"] == pytest.approx(1.6, rel=0.1)
    assert figures["noise_scale_groups"] == pytest.approx(1.6, rel=0.15)
    assert figures["noise_scale_bound"] < figures["noise_scale_groups"]  # a bound below the estimate
    # halves of 20 groups: expected cosine 20 / (20 + 1.6)
    assert noise.split_cosine(gram) == pytest.approx(noise.signal_share(20, 1.6), abs=0.02)
    noisy = noise.noise_figures(gram_of(1.0, 0.2, k=40, d=4000))  # tr Sigma = 160: most of a step is noise
    assert noisy["noise_scale_groups"] == pytest.approx(160, rel=0.35)
    assert noise.signal_share(2, noisy["noise_scale_groups"]) < 0.03


def test_zero_mean_gradients_measure_no_signal_within_their_se():
    """What the placebo must show: gradients whose expectation is 0 (its cosine between halves near 0 too)."""
    for seed in range(5):
        gram = gram_of(0.0, 0.05, k=32, d=4000, seed=seed)
        figures = noise.noise_figures(gram)
        assert abs(figures["signal_sq"]) < 3 * figures["signal_sq_se"]
        assert abs(noise.split_cosine(gram)) < 0.1
        bound = figures["noise_scale_bound"]  # tr Sigma = 10: what 32 groups can rule out is a finite B, not all
        assert bound == pytest.approx(figures["noise_sq"] / (figures["signal_sq"] + 2 * figures["signal_sq_se"]))
        assert 10 < bound < float("inf")
    assert noise.signal_share(16, None) == 0.0  # no signal measured: no share of a step is signal


def test_too_few_groups_are_refused():
    with pytest.raises(ConfigError, match="at least 3 groups"):
        noise.noise_figures(torch.eye(2, dtype=torch.float64))


def test_top_direction_share_is_one_for_gradients_on_one_line_and_small_for_scattered_ones():
    gen = torch.Generator().manual_seed(5)
    line = torch.randn(3000, generator=gen, dtype=torch.float64)
    signs = torch.tensor([1.0, -2.0, 0.5, -1.0, 3.0], dtype=torch.float64)  # one line, signs that cancel
    on_line = signs[:, None] * line + 1e-3 * torch.randn(5, 3000, generator=gen, dtype=torch.float64)
    assert noise.top_direction_share(on_line @ on_line.T) > 0.999
    scattered = torch.randn(8, 3000, generator=gen, dtype=torch.float64)
    assert noise.top_direction_share(scattered @ scattered.T) < 0.2  # 1/8 each, give or take
    assert noise.top_direction_share(torch.zeros(4, 4, dtype=torch.float64)) == 0.0  # every group tied


def test_move_cosines_find_the_preference_each_group_pushes():
    gen = torch.Generator().manual_seed(6)
    moves = {m: torch.randn(2000, generator=gen) for m in ("up", "down", "right")}
    preference = moves["right"] - moves["down"]
    grads = [2.0 * preference, -0.5 * preference + 0.01 * torch.randn(2000, generator=gen), torch.zeros(2000)]
    gram = torch.stack(grads).double() @ torch.stack(grads).double().T
    found = noise.move_cosines(grads, gram, moves)
    assert set(found) == {"up-down", "up-right", "down-right"}
    down_right = found["down-right"]
    assert down_right["groups"][0] == pytest.approx(-1.0, abs=1e-4) and down_right["groups"][1] > 0.99
    assert down_right["groups"][2] is None  # a tied group's gradient is 0: no direction
    assert down_right["top_direction"] > 0.99 and found["up-down"]["top_direction"] < 0.9
    big = torch.randn(4_000_000, generator=gen)  # float32 sums over this many weights drift past 1
    assert noise.cosine(big, 3 * big) == pytest.approx(1.0, abs=1e-12) and noise.cosine(big, -big) >= -1.0


def test_move_gradients_are_the_gradients_of_each_replys_logprob():
    """A small step along the vector for a move raises that reply's log-probability by step x |vector|^2 (the
    vector is the gradient of log p(reply | prompt) over the trained weights), and the replies are the first turn's
    with its last move rewritten."""
    from credit_assignment import run_config

    from envhub.trainer.config import ModelConfig
    from envhub.trainer.learner.step import Learner
    from envhub.trainer.models import build_policy
    from envhub.trainer.trajectory import Trajectory, TurnSpan

    config = run_config(str(ROOT / "configs" / "corridor-tiny.yaml"), ["model.dtype=float32"], estimator="grpo",
                        seed=0, steps=1, curve_every=1, eval_episodes=1, model=None)  # fmt: skip
    model, tokenizer = build_policy(ModelConfig(name="tiny", dtype="float32", tiny_layers=2, tiny_hidden=64), 0)
    learner = Learner.from_config(config, model, tokenizer)
    prompt = tokenizer.encode("The lake: S F H. Your move?", add_special_tokens=False)
    reply = tokenizer.encode("I go up, no: down", add_special_tokens=False)
    n = len(prompt) + len(reply)
    episode = Trajectory(prompt + reply, [0] * len(prompt) + [1] * len(reply), [0.0] * n, [0] * n, 1.0, "t", "g", 0,
                         1, "stop", turn_spans=[TurnSpan(len(prompt), n, 1.0, "a")])  # fmt: skip
    got_prompt, replies = noise.first_move_replies(tokenizer, [[episode]])
    assert got_prompt == prompt and tokenizer.decode(replies["left"]) == "I go up, no: left"
    vectors = noise.move_gradients(learner, got_prompt, replies)
    trained = [p for p in learner.scorer.parameters() if p.requires_grad]
    assert all(p.grad is None for p in trained) and vectors["up"].shape == (sum(p.numel() for p in trained),)

    def logp(ids):
        with torch.no_grad():
            full = torch.tensor([got_prompt + ids])
            mask = torch.zeros_like(full)
            mask[0, len(got_prompt) :] = 1
            return float(learner.scorer(full, torch.ones_like(full), mask).sum())

    step = 1e-3 / float(vectors["right"].norm())
    before = logp(replies["right"])
    with torch.no_grad():
        offset = 0
        for p in trained:
            p += step * vectors["right"][offset : offset + p.numel()].view_as(p)
            offset += p.numel()
    rise = logp(replies["right"]) - before
    assert rise == pytest.approx(step * float(vectors["right"].norm()) ** 2, rel=0.05)
    other = tokenizer.encode("I go there, setup done", add_special_tokens=False)  # "up" inside a word is no move
    m = len(prompt) + len(other)
    wordless = Trajectory(prompt + other, [0] * len(prompt) + [1] * len(other), [0.0] * m, [0] * m, 0.0, "t", "g", 0,
                          1, "stop", turn_spans=[TurnSpan(len(prompt), m, 0.0, "a")])  # fmt: skip
    with pytest.raises(ConfigError, match="names no move"):
        noise.first_move_replies(tokenizer, [[wordless]])


def test_probe_moves_is_refused_for_an_env_without_moves_before_any_work(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        noise.main(["--config", str(ROOT / "configs" / "corridor-tiny.yaml"), "--warm-start", str(tmp_path),
                    "--probe-moves"])  # fmt: skip
    assert "not a grid env whose actions are moves" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [(["--groups", "3"], "at least 4"), (["--estimators", "gipgo"], "unknown")])
def test_bad_arguments_are_refused_before_any_work(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        noise.main(["--warm-start", str(tmp_path), *argv])
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        noise.main(["--warm-start", str(tmp_path / "none")])
    assert "no saved model there" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_measures_each_estimator_on_the_same_groups(tmp_path):
    """The tiny model after a short SFT on the corridor: grpo's and the placebo's gradient of a tied group is 0 and
    of any other group is not (gigpo is left out for CI's time: its path is grpo's with other advantages)."""
    from credit_assignment import run_config
    from learning_parity import warm_start_checkpoint

    config = ROOT / "configs" / "corridor-tiny.yaml"
    sets = ["sft.collect=4", "sft.epochs=1", "rollout.group_size=4", "rollout.concurrent_groups=2"]
    base = run_config(str(config), sets, estimator="grpo", seed=0, steps=1, curve_every=1, eval_episodes=1,
                      model=None)  # fmt: skip
    warm_start_checkpoint(base, tmp_path / "sft")
    out = tmp_path / "noise.json"
    argv = ["--config", str(config), "--warm-start", str(tmp_path / "sft"), "--groups", "5", "--out", str(out)]
    argv += ["--estimators", "grpo,placebo"]
    noise.main(argv + [x for s in sets[2:] for x in ("--set", s)])
    report = json.loads(out.read_text())
    assert report["groups"] + report["dropped_groups"] == 5 and report["groups"] >= 4
    tied = [len(set(rewards)) == 1 for rewards in report["group_rewards"]]
    assert report["tied_groups"] == sum(tied) and not all(tied)
    for name in ("grpo", "placebo"):
        norms = report["estimators"][name]["group_norms"]
        assert [norm == 0 for norm in norms] == tied
    grpo = report["estimators"]["grpo"]
    assert grpo["signal_sq"] + grpo["noise_sq"] == pytest.approx(
        sum(n * n for n in grpo["group_norms"]) / report["groups"], rel=1e-6
    )
    # the report's Gram matrix gives its figures back (read again without playing or differentiating anything)
    again = noise.noise_figures(torch.tensor(grpo["gram"], dtype=torch.float64))
    assert again["signal_sq"] == pytest.approx(grpo["signal_sq"], rel=1e-12, abs=1e-15)
    assert [math.sqrt(grpo["gram"][i][i]) for i in range(report["groups"])] == pytest.approx(grpo["group_norms"])
    assert set(report["cosines"]) == {"grpo:placebo"} and set(report["estimators"]) == {"grpo", "placebo"}
    assert grpo["trained_parameters"] > 0 and -1 <= grpo["split_cosine"] <= 1 and 0 < grpo["top_direction_share"] <= 1
    assert len(report["warm_start_sha256"]) == 64  # which weights were measured, after the checkpoint is gone


def test_sign_agreement_is_a_half_without_signal_and_near_one_with_much():
    gen = torch.Generator().manual_seed(3)
    noise_only = list(torch.randn(16, 20000, generator=gen))
    assert noise.split_sign_agreement(noise_only) == pytest.approx(0.5, abs=0.01)
    strong = [torch.ones(20000) + 0.1 * g for g in noise_only]
    assert noise.split_sign_agreement(strong) == 1.0
