"""The learner step: NaN guard, schedule, first-step logprob check, micro-batch equivalence, per-token staleness."""

import copy
import math

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.config import LearnerConfig
from envhub.trainer.learner.advantages import group_advantages
from envhub.trainer.learner.layers import freeze_below_top_layers
from envhub.trainer.learner.microbatch import chunked_logprobs, plan_micro_batches, shared_prefix
from envhub.trainer.learner.optimizer import lr_factor
from envhub.trainer.learner.step import Learner, LogprobMismatch
from tests.trainer.learner.conftest import algo, make_groups


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_nan_gradient_skips_the_step_and_never_reaches_engine_weights(tiny_model):
    learner = Learner(tiny_model, algo(), 1.0, 0)
    groups = make_groups(tiny_model)
    before = params(tiny_model)
    poisoned = copy.deepcopy(groups)
    poisoned[0][1].behavior_logprobs[-1] = float("nan")  # one bad logprob from an engine
    stats = learner.step(poisoned)
    assert stats["step_skipped"] == 1.0 and stats["skipped_steps"] == 1.0 and not math.isfinite(stats["grad_norm"])
    assert all(torch.equal(before[n], p) for n, p in tiny_model.named_parameters())
    assert all(torch.isfinite(t).all() for t in learner.engine_state().values())
    assert not learner.optimizer.state  # no Adam moments were polluted either
    clean = learner.step(groups)
    assert clean["step_skipped"] == 0.0 and clean["skipped_steps"] == 1.0
    assert any(not torch.equal(before[n], p) for n, p in tiny_model.named_parameters())


def test_warmup_then_constant_or_cosine():
    assert [lr_factor(s, 4, 10, "constant") for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = [lr_factor(s, 2, 10, "cosine") for s in range(11)]
    assert cosine[:3] == [0.5, 1.0, 1.0] and cosine[6] == pytest.approx(0.5) and cosine[10] == pytest.approx(0.0)
    assert all(a >= b for a, b in zip(cosine[1:], cosine[2:]))


def test_learner_uses_the_schedule(tiny_model):
    learner = Learner(tiny_model, algo(lr=1e-3, warmup_steps=2, lr_schedule="cosine"), 1.0, 0, total_steps=4)
    groups = make_groups(tiny_model)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)  # the first step runs at lr / warmup
    lrs = [learner.step(groups)["lr"] for _ in range(3)]
    assert lrs == pytest.approx([1e-3, 1e-3, 5e-4])  # lr of the next step: warmed up, then cosine halfway


def test_first_step_stops_when_behavior_logprobs_used_another_temperature(tiny_model):
    wrong = make_groups(tiny_model, temperature=0.7)  # an engine that applied T=0.7 while the learner assumes 1.0
    learner = Learner(tiny_model, algo(), temperature=1.0, pad_id=0)
    before = params(tiny_model)
    with pytest.raises(LogprobMismatch) as err:
        learner.step(wrong)
    message = str(err.value)
    assert "\n" not in message and "temperature" in message and "before temperature" in message and "dtype" in message
    assert all(torch.equal(before[n], p) for n, p in tiny_model.named_parameters())
    right = Learner(copy.deepcopy(tiny_model), algo(), temperature=0.7, pad_id=0)
    assert right.step(wrong)["kl_behavior"] < 1e-6
    unchecked = Learner(tiny_model, algo(max_initial_kl=0.0), temperature=1.0, pad_id=0)
    assert unchecked.step(wrong)["kl_behavior"] > 0.05


def test_plan_keeps_padded_tokens_within_budget_longest_first():
    lengths = [5, 100, 30, 31, 400, 7, 64]
    plan = plan_micro_batches(lengths, max_tokens=128)
    assert sorted(i for rows in plan for i in rows) == list(range(len(lengths)))
    assert plan[0] == [4]  # longer than the budget: alone
    for rows in plan:
        widths = [lengths[i] for i in rows]
        assert widths == sorted(widths, reverse=True)
        assert len(rows) == 1 or len(rows) * widths[0] <= 128
    assert all(len(rows) <= 2 for rows in plan_micro_batches(lengths, 10_000, max_sequences=2))


def test_chunked_logprobs_match_full_log_softmax_with_gradients():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 300, bias=False)
    hidden = torch.randn(37, 16, requires_grad=True)
    targets = torch.randint(0, 300, (37,))
    full = torch.log_softmax(head(hidden) / 0.7, -1).gather(-1, targets[:, None]).squeeze(-1)
    (g_full,) = torch.autograd.grad(full.sum(), hidden)
    chunked = chunked_logprobs(hidden, targets, head, 0.7, chunk_tokens=8)
    (g_chunk,) = torch.autograd.grad(chunked.sum(), hidden)
    assert torch.allclose(full, chunked, atol=1e-5) and torch.allclose(g_full, g_chunk, atol=1e-5)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_micro_batching_does_not_change_the_update(tiny_model):
    groups = make_groups(tiny_model, lengths=(10, 60))
    twin = copy.deepcopy(tiny_model)
    one = Learner(tiny_model, algo(max_tokens_per_micro_batch=100_000, micro_batch_size=0), 1.0, 0)
    many = Learner(twin, algo(max_tokens_per_micro_batch=64, micro_batch_size=0), 1.0, 0)
    grads = []
    for learner in (one, many):  # look at the accumulated gradient the optimizer would apply
        learner.optimizer.step = lambda model=learner.model: grads.append(
            {n: p.grad.clone() for n, p in model.named_parameters()}
        )
    a, b = one.step(groups), many.step(groups)
    assert a["micro_batches"] == 1 and b["micro_batches"] >= 6 and b["padded_tokens"] < a["padded_tokens"]
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-7, rtol=1e-4), name


def prompted_groups(model, prompt_tokens=48):
    """make_groups' groups with one prompt per group before each row's tokens, and the first reply token of the
    group's rows the same (a model token inside the shared prefix)."""
    groups = make_groups(model, lengths=(20, 50))
    vocab = model.config.vocab_size
    for g, group in enumerate(groups):
        prompt = [(7919 * (g + 1) * (i + 1)) % vocab for i in range(prompt_tokens)]
        for t in group:
            t.input_ids = prompt + [vocab - 1 - g] + t.input_ids
            t.loss_mask = [0] * prompt_tokens + [1] + t.loss_mask
            t.behavior_logprobs = [0.0] * prompt_tokens + [-3.0] + t.behavior_logprobs
            t.versions = [-1] * prompt_tokens + [0] + t.versions
    return groups


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_a_groups_shared_prompt_runs_once_and_the_update_is_the_same(tiny_model):
    groups = prompted_groups(tiny_model)
    twin = copy.deepcopy(tiny_model)
    config = algo(micro_batch_size=4, max_initial_kl=0.0)
    plain = Learner(tiny_model, config, 1.0, 0, learner_config=LearnerConfig(share_prefix=False))
    shared = Learner(twin, config, 1.0, 0, learner_config=LearnerConfig(share_prefix=True))
    grads, fed = [], []
    for learner in (plain, shared):
        learner.optimizer.step = lambda model=learner.model: grads.append(
            {n: p.grad.clone() for n, p in model.named_parameters()}
        )
        tokens = []
        learner.model.model.embed_tokens.register_forward_hook(lambda m, args, out, t=tokens: t.append(args[0].numel()))
        fed.append(tokens)
    a, b = plain.step(groups), shared.step(groups)
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-6, rtol=1e-4), name
    # each micro-batch is one group of 4: its 49 shared tokens (the prompt and the same first reply token) run
    # once, then each row's own tokens beside their keys and values
    assert len(fed[0]) == 2 and fed[1][0::2] == [49, 49] and sum(fed[1]) < sum(fed[0])
    assert a["shared_prefix_tokens"] == 0 and b["shared_prefix_tokens"] == 2 * 3 * 49


def test_shared_prefix_stops_at_the_first_difference_or_padding_and_leaves_each_row_a_token():
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 3, 4, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert shared_prefix(ids, attention) == 3
    assert shared_prefix(ids[[0, 2]], attention[[0, 2]]) == 4  # row 2's padding is not shared
    assert shared_prefix(ids[[0, 0]], attention[[0, 0]]) == 4  # equal rows keep their last token
    assert shared_prefix(torch.tensor([[5, 1], [6, 1]]), torch.ones(2, 2)) == 0


def test_plan_keeps_a_groups_rows_together_longest_group_first():
    lengths, groups = [10, 50, 12, 11, 40, 9], [0, 1, 0, 0, 1, 1]
    assert plan_micro_batches(lengths, 10_000, max_sequences=3, groups=groups) == [[1, 4, 5], [2, 3, 0]]
    assert plan_micro_batches(lengths, 10_000, max_sequences=3) == [[1, 4, 2], [3, 0, 5]]


def test_stale_tokens_are_masked_per_token_not_whole_episodes(tiny_model):
    groups = make_groups(tiny_model, version=3)
    for traj in (t for g in groups for t in g):  # the first half of each reply came from version 1
        model_pos = [i for i, m in enumerate(traj.loss_mask) if m]
        for i in model_pos[: len(model_pos) // 2]:
            traj.versions[i] = 1
    masked = copy.deepcopy(groups)
    for traj in (t for g in masked for t in g):
        traj.loss_mask = [int(m and v >= 2) for m, v in zip(traj.loss_mask, traj.versions)]
    twin = copy.deepcopy(tiny_model)
    dropped = Learner(tiny_model, algo(stale="drop", max_staleness=1), 1.0, 0).step(groups, version=3)
    reference = Learner(twin, algo(stale="drop", max_staleness=1), 1.0, 0).step(masked, version=3)
    stale = sum(1 for g in groups for t in g for m, v in zip(t.loss_mask, t.versions) if m and v < 2)
    assert dropped["stale_tokens"] == stale > 0 and dropped["tokens"] == reference["tokens"]
    for p, q in zip(tiny_model.parameters(), twin.parameters()):  # same tokens trained: same update
        assert torch.allclose(p, q, atol=1e-6)


def test_correct_mode_weights_only_stale_tokens(tiny_model):
    groups = make_groups(tiny_model, version=3)
    groups[0][0].versions = [v if v < 0 else 1 for v in groups[0][0].versions]  # one stale episode
    learner = Learner(tiny_model, algo(stale="correct", max_staleness=1), 1.0, 0)
    stats = learner.step(groups, version=3)
    assert stats["stale_tokens"] == groups[0][0].num_model_tokens and stats["tokens"] == sum(
        t.num_model_tokens for g in groups for t in g
    )


def test_zero_variance_tolerance_in_advantages():
    nearly_equal = torch.tensor([0.3, 0.3 + 1e-5, 0.3, 0.3])  # equal up to the env's float noise
    assert torch.equal(group_advantages(nearly_equal, 4, tol=1e-4), torch.zeros(4))
    assert group_advantages(nearly_equal, 4, tol=0.0).abs().max() > 1.0  # dividing noise by std + 1e-6 made it a signal


def test_train_layers_updates_only_the_top_layers_and_the_engine_gets_every_weight(tiny_model):
    learner = Learner(tiny_model, algo(lr=1e-2), 1.0, 0, learner_config=LearnerConfig(train_layers=1))
    before = params(tiny_model)
    stats = learner.step(make_groups(tiny_model))
    assert stats["step_skipped"] == 0.0
    changed = {n for n, p in tiny_model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith(("model.layers.1.", "model.norm.")) for n in changed)
    trained = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    assert trained == {
        id(p) for n, p in tiny_model.named_parameters() if n.startswith(("model.layers.1.", "model.norm."))
    }
    assert set(learner.engine_state()) == {n for n, _ in tiny_model.named_parameters()}  # frozen ones included


def test_train_layers_beyond_the_model_or_without_decoder_layers_is_refused(tiny_model):
    with pytest.raises(ConfigError, match="train_layers=3 but the model has 2 decoder layers.*from 1 to 2"):
        Learner(copy.deepcopy(tiny_model), algo(), 1.0, 0, learner_config=LearnerConfig(train_layers=3))
    with pytest.raises(ConfigError, match="Linear has no stack of decoder layers"):
        freeze_below_top_layers(torch.nn.Linear(2, 2), 1)
    assert freeze_below_top_layers(tiny_model, 0) == [] and all(p.requires_grad for p in tiny_model.parameters())


def test_gradient_is_the_step_gradient_and_applies_nothing(tiny_model):
    groups = make_groups(tiny_model, n_groups=2)
    measuring = Learner(copy.deepcopy(tiny_model), algo(grad_clip=1e9), 1.0, 0)
    before = params(measuring.model)
    flat = measuring.gradient(groups)
    assert all(torch.equal(before[n], p) for n, p in measuring.model.named_parameters())
    assert not measuring.optimizer.state and measuring.steps == 0
    assert all(p.grad is None for p in measuring.model.parameters())
    trained = sum(p.numel() for p in measuring.model.parameters() if p.requires_grad)
    assert flat.shape == (trained,) and flat.dtype == torch.float32
    stepping = Learner(copy.deepcopy(tiny_model), algo(grad_clip=1e9), 1.0, 0)
    assert float(flat.norm()) == pytest.approx(stepping.step(groups)["grad_norm"], rel=1e-4)
    # the step's loss is a token mean over the whole step: its gradient is the token-weighted mean of each group's
    tokens = [sum(sum(t.loss_mask) for t in g) for g in groups]
    parts = [measuring.gradient([g]) for g in groups]
    weighted = (tokens[0] * parts[0] + tokens[1] * parts[1]) / sum(tokens)
    assert torch.allclose(flat, weighted, atol=1e-6 * float(flat.abs().max()) + 1e-9)
    assert float(parts[0].norm()) > 0 and not torch.allclose(parts[0], parts[1])


def test_gradient_is_refused_when_the_learner_runs_on_several_processes(tiny_model):
    learner = Learner(tiny_model, algo(), 1.0, 0)
    learner.dist = object()  # any process group: this process's gradients would be its shard's
    with pytest.raises(ConfigError, match="several processes") as err:
        learner.gradient(make_groups(tiny_model))
    assert "learner.devices: 1" in err.value.hint
