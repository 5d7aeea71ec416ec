"""Expert data (envhub collect), the SFT warm start in the rollout's token layout, and before/after evaluation."""

import json

import pytest
import torch

from envhub.cli.main import main
from envhub.errors import ConfigError
from envhub.toolcalls import parse_tool_calls
from envhub.trainer.collect import as_tool_call, collect
from envhub.trainer.config import config_from_dict, config_to_dict
from envhub.trainer.sft import layout, load_examples, run_sft, sft_loss
from envhub.trainer.train import Trainer


def test_collect_cli_writes_solved_episodes_with_tool_calls(tmp_path, capsys):
    out = tmp_path / "sokoban.jsonl"
    assert main(["collect", "Sokoban-v0", "--agent", "expert", "-n", "3", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in records] == [0, 1, 2] and all(r["reward"] == 1.0 for r in records)
    first = records[0]["messages"]
    assert first[0]["role"] == "system" and first[1]["role"] == "user" and first[2]["role"] == "assistant"
    (call,) = parse_tool_calls(first[2]["content"]).calls
    assert call.name == "move" and call.arguments["direction"] in ("up", "down", "left", "right")
    assert records[0]["tools"][0]["function"]["name"] == "move"
    import envhub
    from tests.cli.test_main import Echo

    envhub.register("NoSolverCollect-v0", Echo, kwargs={"limit": 2})
    assert main(["collect", "NoSolverCollect-v0", "-n", "1", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "has no solver" in capsys.readouterr().err


async def test_collect_writes_game_moves_and_letters_as_the_experts_text(tmp_path):
    """ExpertAgent plays: a SelfPlay move becomes a `move` tool call, Letters (no tools) stays plain text."""
    (game,) = await collect("TicTacToe-SelfPlay-v0", 1, tmp_path / "t.jsonl")
    (call,) = parse_tool_calls(game.messages[2]["content"]).calls
    assert call.name == "move" and game.messages[2]["content"].startswith(
        "<tool_call>{\"name\": \"move\", \"arguments\": {\"move\": "
    )
    (letters,) = await collect("Letters-v0", 1, tmp_path / "l.jsonl", max_turns=2)
    assert (
        "a e i o u" in letters.messages[1]["content"]
        and letters.messages[2]["content"] == "aeiou"
        and letters.tools == []
    )


def test_oracle_actions_become_calls_of_the_envs_tools():
    tools = [
        {"function": {"name": "search", "parameters": {"properties": {"query": {}}}}},
        {"function": {"name": "click", "parameters": {"properties": {"target": {}}}}},
    ]
    assert json.loads(as_tool_call("click[Buy Now]", tools)[11:-12]) == {
        "name": "click",
        "arguments": {"target": "Buy Now"},
    }
    assert as_tool_call("\\boxed{7}", [tools[0]]) == "\\boxed{7}"
    worked = "2 x 3 = 6, 2 x 4 = 8, 6 + 8 = 14. \\boxed{14}"  # a final answer in text is not a call of the only tool
    assert as_tool_call(worked, [tools[0]]) == worked
    assert json.loads(as_tool_call("right", [tools[0]])[11:-12]) == {"name": "search", "arguments": {"query": "right"}}


async def test_math_demonstrations_are_worked_text_answers(tmp_path):
    (demo,) = await collect("Math-v0", 1, tmp_path / "m.jsonl", env_kwargs={"kind": "arithmetic", "difficulty": 1})
    answer = demo.messages[-1]["content"]
    assert demo.reward == 1.0 and "<tool_call>" not in answer and " x " in answer and answer.endswith("}")


async def test_layout_matches_the_chat_template_and_masks_only_assistant_turns(tokenizer, tmp_path):
    await collect("Sokoban-v0", 1, tmp_path / "d.jsonl")
    record = json.loads((tmp_path / "d.jsonl").read_text())
    example = layout(record["messages"], tokenizer, record["tools"])
    full = tokenizer.apply_chat_template(record["messages"], tools=record["tools"], tokenize=True)
    full = list(full["input_ids"] if hasattr(full, "keys") else full)
    assert example.input_ids == full
    learned = tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m])
    expected = "".join(m["content"] + "<|im_end|>" for m in record["messages"] if m["role"] == "assistant")
    assert learned == expected


async def test_sft_lowers_the_loss_on_expert_turns(tokenizer, tiny_model, tmp_path):
    await collect("FrozenLake-v0", 4, tmp_path / "d.jsonl")
    examples = load_examples(tmp_path / "d.jsonl", tokenizer, max_tokens=512)
    with torch.no_grad():
        before = float(sft_loss(tiny_model, examples, 0))
    stats = run_sft(tiny_model, examples, epochs=6, lr=3e-3, batch_size=2)
    with torch.no_grad():
        after = float(sft_loss(tiny_model, examples, 0))
    assert stats["steps"] == 12 and after < before - 1.0


def test_bad_sft_data_is_one_clear_error(tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_examples(tmp_path / "missing.jsonl", tokenizer)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2 is not a chat record"):
        load_examples(bad, tokenizer)


async def test_train_with_sft_stage_writes_before_sft_after_evaluation(tmp_path):
    await collect("FrozenLake-v0", 4, tmp_path / "expert.jsonl")
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "FrozenLake-v0"}, {"env": "Letters-v0"}],
            "rollout": {"group_size": 2, "max_new_tokens": 8, "max_turns": 2},
            "algorithm": {"groups_per_step": 1, "filter_zero_variance": False},
            "budget": {"steps": 1},
            "sft": {"data": str(tmp_path / "expert.jsonl"), "epochs": 2, "lr": 1e-3},
            "evaluation": {"episodes": 2},
            "out_dir": str(tmp_path / "run"),
        }
    )
    trainer = Trainer(config)
    await trainer.run()
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert set(report) == {"FrozenLake-v0", "Letters-v0", "overall"}
    for task in ("FrozenLake-v0", "Letters-v0"):
        assert {"before", "sft", "after", "episodes"} <= set(report[task]) and report[task]["episodes"] == 2
    assert trainer.sft_stats["steps"] == 2 and trainer.sft_stats["last_loss"] < trainer.sft_stats["first_loss"]
    from envhub.trainer.run.record import read_episodes

    evaluated = read_episodes(tmp_path / "run" / "eval-after")  # the evaluated episodes are recorded too
    assert sorted((e["task"], e["seed"]) for e in evaluated) == sorted(
        (t, s) for t in ("FrozenLake-v0", "Letters-v0") for s in (1_000_000, 1_000_001)
    )


async def test_sft_of_the_top_layers_leaves_the_rest_and_unfreezes_for_rl(tokenizer, tiny_model, tmp_path):
    await collect("Math-v0", 2, tmp_path / "d.jsonl")
    examples = load_examples(tmp_path / "d.jsonl", tokenizer)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    run_sft(tiny_model, examples, epochs=1, lr=1e-2, batch_size=2, train_layers=1)
    changed = {n for n, p in tiny_model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith(("model.layers.1.", "model.norm.")) for n in changed)
    assert all(p.requires_grad for p in tiny_model.parameters())


async def test_evaluation_serves_a_copy_in_the_training_engines_dtype(tokenizer, tiny_model, monkeypatch):
    """Held-out episodes are played by the policy as the rollouts' engine serves it; the fp32 masters stay."""
    from envhub.trainer.engines.embedded import engine as local
    from envhub.trainer.engines.embedded.kind import embedded_dtype
    from envhub.trainer.evaluation import evaluate_policy

    config = config_from_dict(
        {
            "model": {"name": "tiny", "dtype": "bfloat16"},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"max_new_tokens": 4, "max_turns": 1},
            "evaluation": {"episodes": 2},
        }
    )
    assert embedded_dtype(config) == torch.bfloat16
    fp32_engine = config_from_dict({**config_to_dict(config), "engine": {"kind": "local", "dtype": "float32"}})
    assert embedded_dtype(fp32_engine) == "float32"
    served = []
    original = local.EmbeddedEngine.__init__

    def spy(self, model, *args, **kwargs):
        original(self, model, *args, **kwargs)
        served.append((self.model, next(self.model.parameters()).dtype))

    monkeypatch.setattr(local.EmbeddedEngine, "__init__", spy)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    result = await evaluate_policy(tiny_model, tokenizer, config)
    assert len(result.rewards["Letters-v0"]) == 2 and not result.errors
    ((engine_model, dtype),) = served
    assert dtype == torch.bfloat16 and engine_model is not tiny_model
    assert all(p.dtype == torch.float32 and torch.equal(p, before[n]) for n, p in tiny_model.named_parameters())


async def test_the_final_evaluation_copy_is_kept_in_the_engine_dtype_and_gets_the_trained_weights(
    tmp_path, monkeypatch
):
    from safetensors.torch import load_file

    from envhub.trainer.evaluation import BeforeAfter

    seen = {}
    original = BeforeAfter.measure

    async def spy(self, label, model, tokenizer):
        seen[label] = {name: p.detach().clone() for name, p in model.named_parameters()}
        return await original(self, label, model, tokenizer)

    monkeypatch.setattr(BeforeAfter, "measure", spy)
    config = config_from_dict(
        {
            "model": {"name": "tiny", "dtype": "bfloat16"},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 4, "max_new_tokens": 4, "max_turns": 1},
            "algorithm": {"groups_per_step": 1, "lr": 0.01, "filter_zero_variance": False},
            "budget": {"steps": 2, "checkpoint_every": 2},
            "evaluation": {"episodes": 2},
            "out_dir": str(tmp_path / "run"),
        }
    )
    await Trainer(config).run()
    before, after = seen["before"], seen["after"]
    assert before["lm_head.weight"].dtype == torch.float32  # "before" evaluates the learner's own fp32 masters
    assert {p.dtype for p in after.values()} == {torch.bfloat16}  # the kept copy: half the memory of fp32
    (saved,) = (tmp_path / "run").glob("checkpoints/*/model.safetensors")
    trained = load_file(saved)
    assert not torch.equal(trained["lm_head.weight"].float(), before["lm_head.weight"])  # the steps moved it
    for name, value in after.items():
        assert torch.equal(value, trained[name].to(torch.bfloat16)), name  # the final weights, cast once


async def test_evaluation_max_turns_caps_held_out_episodes_below_the_rollouts(tiny_model, tokenizer, tmp_path):
    from envhub.trainer.evaluation import evaluate_policy

    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Corridor-v0", "kwargs": {"length": 2, "max_turns": 6}}],
            "rollout": {"max_new_tokens": 2, "max_turns": 6},
            "evaluation": {"episodes": 3, "temperature": 1.0, "max_turns": 1},
        }
    )
    await evaluate_policy(tiny_model, tokenizer, config, tmp_path / "eval")
    episodes = [json.loads(line) for line in (tmp_path / "eval" / "episodes.jsonl").read_text().splitlines()]
    # two squares cannot be walked in one turn: each episode is cut after its first, though the rollout allows 6
    assert [(e["steps"], e["finish"]) for e in episodes] == [(1, "max_turns")] * 3
    with pytest.raises(ConfigError, match=r"evaluation.max_turns must be >= 0 \(0 = rollout.max_turns\)"):
        config_from_dict({**config_to_dict(config), "evaluation": {"max_turns": -1}})
    with pytest.raises(ConfigError, match="episode_timeout_s and rollout.episode_timeout_s must be positive"):
        config_from_dict({**config_to_dict(config), "evaluation": {"episode_timeout_s": 0}})


async def test_held_out_episodes_in_flight_are_bounded_by_the_engines_batch(tiny_model, tokenizer, monkeypatch):
    """More episodes than batch rows would only queue, each spending its episode_timeout_s waiting for a row."""
    from envhub.trainer.engines.embedded import engine as local
    from envhub.trainer.evaluation import evaluate_policy

    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "engine": {"max_batch_size": 2},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"max_new_tokens": 3, "max_turns": 1},
            "evaluation": {"episodes": 5},
        }
    )
    in_flight, most = 0, 0
    original = local.EmbeddedEngine.generate

    async def counting(self, *args, **kwargs):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            return await original(self, *args, **kwargs)
        finally:
            in_flight -= 1

    monkeypatch.setattr(local.EmbeddedEngine, "generate", counting)
    result = await evaluate_policy(tiny_model, tokenizer, config)
    assert len(result.rewards["Letters-v0"]) == 5 and most == 2  # all 5 at once before


async def test_held_out_episodes_left_out_by_error_are_counted_and_named(tiny_model, tokenizer, tmp_path, capsys):
    """A timed-out held-out episode is not silently dropped: eval.json and the printed line say how many and why."""
    from envhub.trainer.evaluation import BeforeAfter

    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"max_new_tokens": 3, "max_turns": 1},
            "evaluation": {"episodes": 3, "episode_timeout_s": 1e-6},
        }
    )
    evaluation = BeforeAfter(config, tmp_path)
    await evaluation.measure("before", tiny_model, tokenizer)
    row = json.loads((tmp_path / "eval.json").read_text())["Letters-v0"]
    assert row["before_left_out"] == {"timeout": 3} and row["episodes"] == 3
    out = capsys.readouterr().out
    assert "Letters-v0: 3 of 3 (timeout 3)" in out and "raise it for this machine" in out


def test_the_overall_held_out_figure_counts_a_task_without_a_scored_episode_as_zero():
    """One rule for the overall figure: eval.json's (BeforeAfter.report) and the credit benchmark's step 0 and
    checkpoint curve (PolicyEval.overall) agree, also when every episode of a task was left out."""
    from collections import Counter

    from envhub.trainer.evaluation import PolicyEval

    result = PolicyEval({"Letters-v0": [1.0, 0.5], "Math-v0": []}, {"Math-v0": Counter(timeout=2)})
    assert result.means() == {"Letters-v0": 0.75} and result.overall() == pytest.approx(0.375)
    assert PolicyEval({}).overall() == 0.0


async def test_collect_gives_the_env_its_own_max_turns_and_caps_the_collector_apart(tmp_path):
    waster = {"length": 4, "max_turns": 8, "demo_waste": 0.9}  # a demonstrator that mostly waits: no early arrival
    (demo,) = await collect("Corridor-v0", 1, tmp_path / "c.jsonl", env_kwargs=waster)
    assert sum(m["role"] == "assistant" for m in demo.messages) == 8  # the env's 8 turns, not its default 5
    (capped,) = await collect("Corridor-v0", 1, tmp_path / "d.jsonl", max_turns=3, env_kwargs=waster)
    assert sum(m["role"] == "assistant" for m in capped.messages) == 3


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
async def test_sft_computes_in_the_runs_precision_on_fp32_masters(tokenizer, tmp_path, dtype):
    # model.dtype bfloat16 means fp32 master weights and bf16 compute for every learner stage, SFT included: before,
    # SFT ran its matmuls in fp32 whatever the config said (on a CPU with bf16 units, about half their speed)
    from envhub.trainer.models import tiny_llama
    from envhub.trainer.sft import warm_start

    await collect("FrozenLake-v0", 2, tmp_path / "expert.jsonl")
    config = config_from_dict(
        {
            "model": {"name": "tiny", "dtype": dtype},
            "tasks": [{"env": "FrozenLake-v0"}],
            "sft": {"data": str(tmp_path / "expert.jsonl"), "epochs": 1, "lr": 1e-3, "batch_size": 2},
        }
    )
    model = tiny_llama(tokenizer, seed=0)
    seen = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    stats = await warm_start(model, tokenizer, config, tmp_path)
    assert stats["steps"] == 1 and seen and set(seen) == {getattr(torch, dtype)}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the masters stay fp32
