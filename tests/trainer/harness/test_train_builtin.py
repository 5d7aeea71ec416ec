"""GRPO steps through the built-in harnesses themselves, unmodified from PyPI (the OpenAI Agents SDK, mini-swe-agent),
each episode in a real bubblewrap sandbox reaching the trainer's embedded engine through the recording gateway; what
the learner trains is checked token for token against what the engine generated.

A random tiny model gives a group no reward variance (every episode fails alike), so each test first teaches it
(`teach_either`) two answers to the harness's exact first prompt, tied at the one token where they part: one right, one
wrong. Sampling at temperature 1 then picks each with even chances, and `rollout.seeded` makes the draw of each
episode the same on every run, whatever else the machine runs: the seed below is one whose first group draws both.
Each episode makes one model call, so each merges into one trajectory of one call. Kept small because importing the
SDK costs about 4 CPU-seconds per episode and mini-swe-agent (LiteLLM) about 8.
"""

from __future__ import annotations

import json

import pytest

import envhub
from envhub.errors import HarnessError
from envhub.sandboxes.testing import unavailable
from tests.trainer.gateway.conftest import teach_either
from tests.trainer.harness.conftest import AddEnv, running_gateway
from tests.trainer.harness.test_train import model_runs

pytest.importorskip("torch")


class SevenEnv(AddEnv):
    """AddEnv asking 3 + 4 whatever the seed, so the prompt the model is taught does not depend on the task seed."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        self.a, self.b = 3, 4
        return "What is 3 + 4?", info


envhub.register("HarnessSeven-v0", SevenEnv, tags=("test",))

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
            "algorithm": {"mode": "sync", "groups_per_step": 1, "lr": 0.01},
            # a run whose groups never differ (the filter drops them) stops here instead of playing on
            "budget": {"steps": steps, "checkpoint_every": 10, "max_time_s": max_time_s},
            # fp32 on every machine: engine.dtype auto serves bf16 on CPUs with bf16 units, whose rounding moves
            # the taught ties (and spoils a long taught answer), so the seeded draws would differ between machines
            "engine": {"dtype": "float32"},
            "seed": seed,
            "out_dir": str(out_dir),
        }
    )


@pytest.fixture
def recorded(monkeypatch):
    """What the engine generated (prompt ids -> [(output ids, logprobs)]) and what the learner trained
    ([(groups, stats)]), seen through the real `EmbeddedEngine.generate` and `Learner.step`."""
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.learner.step import Learner

    generated: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}
    trained: list[tuple[list, dict]] = []
    generate, step = EmbeddedEngine.generate, Learner.step

    async def recording_generate(self, input_ids, sampling):
        result = await generate(self, input_ids, sampling)
        generated.setdefault(tuple(input_ids), []).append((list(result.output_ids), list(result.logprobs)))
        return result

    def recording_step(self, groups, version=0):
        stats = step(self, groups, version)
        trained.append((groups, stats))
        return stats

    monkeypatch.setattr(EmbeddedEngine, "generate", recording_generate)
    monkeypatch.setattr(Learner, "step", recording_step)
    return generated, trained


def serve_taught(monkeypatch, model, tokenizer) -> None:
    """The trainer's policy is `model` (the tiny model `build_policy` made, then taught)."""
    from envhub.trainer import train

    monkeypatch.setattr(train, "build_policy", lambda config, seed: (model, tokenizer))


def check_training(out_dir, trained, generated, steps: int, rewards: set[float]) -> list:
    """What both tests assert of a run: each step trained one group of 2 episodes with reward variance and a nonzero
    gradient on exactly the harness's sampled tokens, each the engine's own output for exactly its prompt, each
    episode one merged call, and the run record agreeing. Returns the trained samples."""
    from envhub.trainer.learner.advantages import sample_advantages
    from envhub.trainer.trajectory import episodes_of

    assert len(trained) == steps
    samples = []
    for groups, stats in trained:
        [group] = groups
        assert len(episodes_of(group)) == len(group) == 2  # one call each: one sample per episode
        assert {t.reward for t in group} == rewards  # reward variance: one right answer, one wrong
        assert sorted(sample_advantages(group).tolist()) == pytest.approx([-1.0, 1.0], abs=1e-3)
        assert stats["grad_norm"] > 0 and stats["tokens"] == sum(t.num_model_tokens for t in group) > 0
        samples += group
    for sample in samples:  # every trained token is one the engine sampled after exactly that prompt
        [(start, end)] = model_runs(sample.loss_mask)
        assert end == len(sample.input_ids) and sample.turns == 1
        made = (sample.input_ids[start:end], sample.behavior_logprobs[start:end])
        assert made in generated[tuple(sample.input_ids[:start])]
        assert sample.env_info["merged"] and not sample.episode  # merged: no split episode key

    records = [json.loads(line) for line in (out_dir / "episodes.jsonl").read_text().splitlines()]
    for sample in samples:  # its episode's one record: the one call, token for token, and one merged sample
        [record] = [
            r
            for r in records
            if r["kind"] == "episode"
            and r["group_id"] == sample.group_id
            and r["log"][0]["output_ids"] == sample.input_ids[sum(1 for m in sample.loss_mask if not m) :]
        ]
        [call] = record["log"]
        assert call["kind"] == "call" and call["prompt_ids"] + call["output_ids"] == sample.input_ids
        assert call["logprobs"] == [lp for lp, m in zip(sample.behavior_logprobs, sample.loss_mask) if m]
        assert record["env_info"]["merged"] and record["env_info"]["samples"] == record["env_info"]["calls"] == 1
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["merged_share"] for r in rows] == [1.0] * steps
    return samples


@pytest.mark.slow
async def test_grpo_trains_the_agents_sdk_on_what_the_engine_generated(tmp_path, base_rootfs, monkeypatch, recorded):
    from envhub.trainer.gateway.render import ChatRenderer
    from envhub.trainer.harness.builtin import BUILTIN
    from envhub.trainer.harness.env import task_text
    from envhub.trainer.models import build_policy
    from envhub.trainer.train import Trainer

    try:
        BUILTIN["openai-agents"].check()
    except HarnessError as exc:
        unavailable(str(exc))  # a failure where `make test` runs, a skip elsewhere
    task = {"env": "HarnessSeven-v0", "harness": "openai-agents"}
    config = train_config(tmp_path, task, {"max_new_tokens": 8, "max_turns": 1}, steps=2, seed=0, max_time_s=60)
    model, tokenizer = build_policy(config.model, config.seed)
    renderer = ChatRenderer(tokenizer)
    messages = [  # what the SDK sends on its one call (its instructions, the task as input; no tools)
        {"role": "system", "content": BUILTIN["openai-agents"].env["ENVHUB_INSTRUCTIONS"]},
        {"role": "user", "content": task_text(SevenEnv.system_prompt, "What is 3 + 4?")},
    ]
    prompt = renderer.prompt(messages, None, None).ids
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    teach_either(model, prompt, [renderer.encode("7") + [end], renderer.encode("8") + [end]])
    serve_taught(monkeypatch, model, tokenizer)
    generated, trained = recorded

    result = await Trainer(config).run()

    assert result.last_step == 2
    assert set(generated) == {tuple(prompt)}  # every call was the SDK's first, as taught
    samples = check_training(tmp_path, trained, generated, steps=2, rewards={0.0, 1.0})
    assert {tokenizer.decode(t.input_ids[len(prompt) :], skip_special_tokens=True) for t in samples} == {"7", "8"}


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
    teach_either(model, first.prompt_ids, [renderer.encode(swe_call(n)) + [end] for n in (1, 2)])
    serve_taught(monkeypatch, model, tokenizer)
    generated, trained = recorded
    generated.clear()

    result = await Trainer(config).run()

    assert result.last_step == 1
    assert set(generated) == {tuple(first.prompt_ids)}
    samples = check_training(tmp_path, trained, generated, steps=1, rewards={0.0, 1.0})
    for sample in samples:  # the task's hidden tests pass on the right fix (index + 1) only
        fix = tokenizer.decode(sample.input_ids[len(first.prompt_ids) :])
        assert ("index + 1/" in fix) == (sample.reward == 1.0), fix
