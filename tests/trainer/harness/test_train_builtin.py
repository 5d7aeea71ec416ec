"""GRPO steps through the built-in harnesses themselves, unmodified from PyPI (the OpenAI Agents SDK, mini-swe-agent),
each episode in a real bubblewrap sandbox reaching the trainer's embedded engine through the recording gateway; what
the learner trains is checked token for token against what the engine generated.

A random tiny model gives a group no reward variance (every episode fails alike), so each test first teaches it
(`teach_either`) two answers to the harness's exact first prompt, tied at the one token where they part: one right, one
wrong. Sampling at temperature 1 then picks each with even chances, and `rollout.seeded` makes each episode's draws
the same on every run, whatever else the machine runs (and fp32 serving on every machine): each test's seed is one
whose first group of each step draws both answers, found once by trying seeds. The SDK answers through the env's tool
and then once more (two calls merging into one trajectory); mini-swe-agent fixes a SWE task in one call. Kept small:
importing the SDK costs about 4 CPU-seconds per episode and mini-swe-agent (LiteLLM) about 8.
"""

from __future__ import annotations

import json

import pytest

import envhub
from envhub.errors import HarnessError
from envhub.sandboxes.testing import unavailable
from tests.trainer.gateway.conftest import teach_either
from tests.trainer.harness.conftest import ANSWER_TOOL, AddToolEnv, running_gateway
from tests.trainer.harness.test_train import model_runs

torch = pytest.importorskip("torch")


class SevenToolEnv(AddToolEnv):
    """AddToolEnv asking 3 + 4 whatever the seed, so the prompt the model is taught does not depend on the task seed."""

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed)
        self.a, self.b = 3, 4
        return "What is 3 + 4?", info


envhub.register("HarnessSevenTool-v0", SevenToolEnv, tags=("test",))


def answer_call(value: int) -> str:
    """A call of the env's answer tool as the model writes it (SmolLM2's template has no tool rendering)."""
    return f'<tool_call>\n{{"name": "answer", "arguments": {{"value": {value}}}}}\n</tool_call>'


SWE_INSTANCE = "cfgkit__tomlette-3"  # its fix: `lineno = index` -> `lineno = index + 1` in tomlette/parser.py


def swe_call(increment: int) -> str:
    """mini-swe-agent's bash tool call that edits the line and submits (the echo first: its submission check)."""
    command = (
        f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && sed -i 's/= index$/= index + {increment}/' tomlette/parser.py"
    )
    return '<tool_call>\n{"name": "bash", "arguments": {"command": "' + command + '"}}\n</tool_call>'


def train_config(
    out_dir, task: dict, rollout: dict, steps: int, seed: int, max_time_s: float, model: dict | None = None
):
    from envhub.trainer.config import config_from_dict

    return config_from_dict(
        {
            "model": {"name": "tiny", **(model or {})},
            "tasks": [task],
            "rollout": {"group_size": 2, "seeded": True, "concurrent_groups": 1, "temperature": 1.0, **rollout},
            # a small step: the taught answers are a least-squares fit that a large one would undo before step 2
            "algorithm": {"mode": "sync", "groups_per_step": 1, "lr": 1e-4},
            # a run whose groups never differ (the filter drops them) stops here instead of playing on
            "budget": {"steps": steps, "checkpoint_every": 10, "max_time_s": max_time_s},
            # fp32 on every machine: engine.dtype auto serves bf16 on CPUs with bf16 units, whose rounding moves
            # the taught ties (and spoils a long taught answer), so the seeded draws would differ between machines
            "engine": {"dtype": "float32"},
            "seed": seed,
            "out_dir": str(out_dir),
        }
    )


def serve_taught(monkeypatch, model, tokenizer) -> None:
    """The trainer's policy is `model` (the tiny model `build_policy` made, then taught)."""
    from envhub.trainer import train

    monkeypatch.setattr(train, "build_policy", lambda config, seed: (model, tokenizer))


def check_training(out_dir, trained, generated, steps: int, calls: int) -> list:
    """What both tests assert of a run: each step trained one group of 2 episodes with reward variance and a nonzero
    gradient on exactly the harness's sampled tokens, each run of them the engine's own output for exactly the prompt
    before it; each episode's `calls` calls merged into one trajectory, and the run record agreeing. Returns the
    trained samples."""
    from envhub.trainer.learner.advantages import sample_advantages
    from envhub.trainer.trajectory import episodes_of

    assert len(trained) == steps
    samples = []
    for groups, stats in trained:
        [group] = groups
        assert len(episodes_of(group)) == len(group) == 2  # merged: one sample per episode
        assert {t.reward for t in group} == {0.0, 1.0}  # reward variance: one right answer, one wrong
        assert sorted(sample_advantages(group).tolist()) == pytest.approx([-1.0, 1.0], abs=1e-3)
        assert stats["grad_norm"] > 0 and stats["tokens"] == sum(t.num_model_tokens for t in group) > 0
        samples += group
    for sample in samples:  # every trained token is one the engine sampled after exactly that prompt
        runs = model_runs(sample.loss_mask)
        assert len(runs) == sample.turns == calls and runs[-1][1] == len(sample.input_ids)
        for start, end in runs:
            made = (sample.input_ids[start:end], sample.behavior_logprobs[start:end])
            assert made in generated[tuple(sample.input_ids[:start])]
        assert sample.env_info["merged"] and not sample.episode  # merged: no split episode's key

    records = [json.loads(line) for line in (out_dir / "episodes.jsonl").read_text().splitlines()]
    episodes = [r for r in records if r["kind"] == "episode"]
    for sample in samples:  # its episode's one record: its calls, token for token, and one merged sample
        [record] = [  # in a trained group the two episodes differ
            r
            for r in episodes
            if r["group_id"] == sample.group_id
            and r["log"][-1]["prompt_ids"] + r["log"][-1]["output_ids"] == sample.input_ids
        ]
        assert [c["kind"] for c in record["log"]] == ["call"] * calls
        sampled = [lp for lp, m in zip(sample.behavior_logprobs, sample.loss_mask) if m]
        assert [lp for call in record["log"] for lp in call["logprobs"]] == sampled
        assert record["env_info"]["merged"] and record["env_info"]["samples"] == 1
        # each call spliced every earlier answer as the ids the model sampled (the harness sent them back as they
        # came) and re-tokenized none of the model's turns
        assert [(c["echoed"], c["reencoded"]) for c in record["log"]] == [(i, 0) for i in range(calls)]
        assert record["env_info"]["calls"] == calls
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["merged_share"] for r in rows] == [1.0] * steps
    return samples


@pytest.mark.slow
async def test_grpo_trains_the_agents_sdk_on_what_the_engine_generated(tmp_path, base_rootfs, monkeypatch, recorded):
    """The SDK calls the env's answer tool over MCP (7 right, 8 wrong: the taught tie), then answers after the tool's
    result: two calls, the second echoing the first, merged into one trajectory."""
    from envhub.trainer.gateway.render import ChatRenderer
    from envhub.trainer.harness import HarnessEnv
    from envhub.trainer.harness.builtin import BUILTIN
    from envhub.trainer.harness.env import task_text
    from envhub.trainer.models import build_policy
    from envhub.trainer.train import Trainer

    try:
        BUILTIN["openai-agents"].check()
    except HarnessError as exc:
        unavailable(str(exc))  # a failure where `make test` runs, a skip elsewhere
    task = {"env": "HarnessSevenTool-v0", "harness": "openai-agents"}
    config = train_config(
        tmp_path,
        task,
        {"max_new_tokens": 32, "max_turns": 2},
        steps=2,
        seed=2,
        max_time_s=60,
        model={"tiny_hidden": 128},
    )
    model, tokenizer = build_policy(config.model, config.seed)
    renderer = ChatRenderer(tokenizer)
    messages = [  # what the SDK sends first: its instructions, the task as input, the env's tool
        {"role": "system", "content": BUILTIN["openai-agents"].env["ENVHUB_INSTRUCTIONS"]},
        {"role": "user", "content": task_text(SevenToolEnv.system_prompt, "What is 3 + 4?")},
    ]
    first = renderer.prompt(messages, [ANSWER_TOOL], None).ids
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answers = {value: renderer.encode(answer_call(value)) + [end] for value in (7, 8)}
    second: dict[int, list[int]] = {}
    untaught = model.lm_head.weight.detach().clone()
    async with running_gateway(model, tokenizer, temperature=0.0, max_tokens_per_request=32) as gateway:
        harness = HarnessEnv(SevenToolEnv, "openai-agents", gateway, wall_clock_s=60)
        for value in (7, 8):  # the SDK's second prompt after each answer: its history with the tool's result
            with torch.no_grad():
                model.lm_head.weight.copy_(untaught)  # this answer alone
            teach_either(model, [(first, [answers[value]])])
            calls = (await harness.play(seed=0)).calls  # the untaught second reply may break the SDK: no matter
            assert calls[0].prompt_ids == first and calls[0].output_ids == answers[value]
            second[value] = calls[1].prompt_ids
    done = renderer.encode("Done.") + [end]
    teach_either(model, [(first, list(answers.values())), (second[7], [done]), (second[8], [done])])
    serve_taught(monkeypatch, model, tokenizer)
    generated, trained = recorded
    generated.clear()

    result = await Trainer(config).run()

    assert result.last_step == 2
    assert set(generated) == {tuple(first), tuple(second[7]), tuple(second[8])}  # every call as taught
    samples = check_training(tmp_path, trained, generated, steps=2, calls=2)
    for sample in samples:  # the right answer (7) scored 1 through the env's tool; the second call echoed the first
        value = 7 if sample.reward == 1.0 else 8
        assert sample.input_ids == second[value] + done


@pytest.mark.slow
async def test_grpo_trains_mini_swe_agent_on_a_swe_task(tmp_path, base_rootfs, monkeypatch, recorded):
    from envhub.trainer.gateway.render import ChatRenderer
    from envhub.trainer.harness import HarnessEnv
    from envhub.trainer.harness.builtin import BUILTIN
    from envhub.trainer.models import build_policy
    from envhub.trainer.train import Trainer

    try:
        BUILTIN["mini-swe-agent"].check()
    except HarnessError as exc:
        unavailable(str(exc))
    kwargs = {"instance_ids": [SWE_INSTANCE], "backend": "bwrap", "image": base_rootfs}
    task = {"env": "SWE-v0", "kwargs": kwargs, "harness": "mini-swe-agent", "harness_env": {"ENVHUB_MAX_TURNS": "1"}}
    rollout = {"max_new_tokens": 96, "max_turns": 1, "max_total_tokens": 4096, "episode_timeout_s": 120}
    # hidden 128: room for a least-squares fit of two 60-token answers parting near their end
    config = train_config(tmp_path, task, rollout, steps=1, seed=1, max_time_s=120, model={"tiny_hidden": 128})
    model, tokenizer = build_policy(config.model, config.seed)
    async with running_gateway(model, tokenizer, temperature=0.0, max_tokens_per_request=96) as gateway:
        harness = HarnessEnv(
            "SWE-v0", "mini-swe-agent", gateway, wall_clock_s=120, env_kwargs=kwargs, extra_env=task["harness_env"]
        )
        untaught = await harness.play(seed=0)  # records mini-swe-agent's own first prompt
    [first] = untaught.calls
    renderer = ChatRenderer(tokenizer)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    teach_either(model, [(first.prompt_ids, [renderer.encode(swe_call(n)) + [end] for n in (1, 2)])])
    serve_taught(monkeypatch, model, tokenizer)
    generated, trained = recorded
    generated.clear()

    result = await Trainer(config).run()

    assert result.last_step == 1
    assert set(generated) == {tuple(first.prompt_ids)}
    samples = check_training(tmp_path, trained, generated, steps=1, calls=1)
    for sample in samples:  # the task's hidden tests pass on the right fix (index + 1) only
        fix = tokenizer.decode(sample.input_ids[len(first.prompt_ids) :])
        assert ("index + 1/" in fix) == (sample.reward == 1.0), fix
