"""Training a harness: GRPO steps on the tiny model whose episodes are an external program, sandboxed, reaching the
trainer's own engine through the recording gateway; what the learner trains is what the engine generated.

The program is a small harness written with the real `openai` client (tests/trainer/harness/scripts.py), not the
Agents SDK: importing the SDK costs about 4 CPU-seconds per episode on the 2-core CI machine against 1.4 for the
client, and a few steps play 16 or more episodes. The built-ins themselves (the SDK, mini-swe-agent) train in a
few small groups in test_train_builtin.py.
"""

from __future__ import annotations

import json

import pytest

from envhub.errors import HarnessError
from envhub.sandboxes.testing import unavailable
from tests.trainer.harness.scripts import OPENAI_CLIENT, command

pytest.importorskip("torch")


def harness_config(out_dir):
    from envhub.trainer.config import config_from_dict

    letters = {"env": "Letters-v0", "kwargs": {"letters": "aeiou"}, "harness": command(OPENAI_CLIENT)}
    return config_from_dict(
        {
            "model": {"name": "tiny"},
            # the same harness keeping its history (its calls merge) and rewriting it (they split); the mixture's
            # draws from seed 0 are rewrite, keep, keep, rewrite: the two steps train one group of each
            "tasks": [
                {**letters, "harness_env": {"HISTORY": "keep"}},
                {**letters, "harness_env": {"HISTORY": "rewrite"}},
            ],
            "rollout": {"group_size": 4, "max_new_tokens": 8, "max_turns": 2, "concurrent_groups": 1},
            "algorithm": {"mode": "sync", "groups_per_step": 1, "lr": 0.01},
            "budget": {"steps": 2, "checkpoint_every": 10},
            "seed": 0,
            "out_dir": str(out_dir),
        }
    )


def model_runs(mask: list[int]) -> list[tuple[int, int]]:
    """The [start, end) spans of consecutive model tokens (loss mask 1)."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.mark.slow
async def test_grpo_trains_a_harness_on_what_the_engine_generated(tmp_path, base_rootfs, recorded):
    from envhub.trainer.harness.builtin import BUILTIN, overlay_dir
    from envhub.trainer.learner.advantages import sample_advantages
    from envhub.trainer.train import Trainer
    from envhub.trainer.trajectory import episodes_of

    try:
        BUILTIN["openai-agents"].check()  # the built-ins' packages hold the openai client this harness imports
    except HarnessError as exc:
        unavailable(str(exc))
    assert (overlay_dir() / "openai").is_dir()
    generated, trained = recorded
    result = await Trainer(harness_config(tmp_path)).run()

    assert result.last_step == 2 and len(trained) == 2
    for groups, stats in trained:  # the filter kept only groups whose episodes' rewards differed
        assert all(len({e[0].reward for e in episodes_of(g)}) > 1 for g in groups)
        assert all(len(episodes_of(g)) == 4 for g in groups)  # group_size episodes, however many samples
        assert stats["grad_norm"] > 0 and stats["tokens"] == sum(t.num_model_tokens for g in groups for t in g)
    samples = [t for groups, _ in trained for g in groups for t in g]
    for sample in samples:  # every trained token is one the engine sampled after exactly that prompt
        runs = model_runs(sample.loss_mask)
        assert runs and len(runs) == sample.turns
        for start, end in runs:
            made = (sample.input_ids[start:end], sample.behavior_logprobs[start:end])
            assert made in [(ids, lps) for ids, lps in generated[tuple(sample.input_ids[:start])]]
    merged = [t for t in samples if t.env_info["merged"]]
    split = [t for t in samples if not t.env_info["merged"]]
    assert merged and split
    assert all(t.turns == 2 and not t.episode for t in merged)
    assert all(t.episode and t.env_info["samples"] == 2 for t in split)
    for groups, _ in trained:  # a split episode's two samples share its one advantage
        for g in groups:
            advantages = dict(zip(map(id, g), sample_advantages(g).tolist()))
            for episode in episodes_of(g):
                assert len({advantages[id(t)] for t in episode}) == 1

    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    episodes = [r for r in records if r["kind"] == "episode" and r["finish_reason"] != "cancelled"]
    trained_ids = {g[0].group_id for groups, _ in trained for g in groups}
    for group_id in trained_ids:  # one record per episode, listing its calls and whether they merged
        mine = [r for r in episodes if r["group_id"] == group_id]
        assert len(mine) == 4 and all([c["kind"] for c in r["log"]] == ["call", "call"] for r in mine)
        assert all(r["env_info"]["samples"] == (1 if r["env_info"]["merged"] else 2) for r in mine)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["merged_share"] <= 1.0 for r in rows)


async def test_a_harness_failing_after_calling_the_model_is_dropped_or_trained_with_reward_0(
    tiny_policy, tokenizer, base_rootfs
):
    from envhub.trainer.config import RolloutConfig, TaskConfig
    from envhub.trainer.engines.embedded.engine import EmbeddedEngine
    from envhub.trainer.rollout.harness_rollouts import HarnessRollouts
    from tests.trainer.harness.scripts import CRASH, NO_CALL

    engine = EmbeddedEngine(tiny_policy, tokenizer)
    rollouts = HarnessRollouts(engine, tokenizer, RolloutConfig(group_size=2, max_new_tokens=4))
    seen = []
    rollouts.on_episode = seen.append
    try:
        crash = TaskConfig(env="Letters-v0", harness=command(CRASH))
        assert await rollouts.play_group(crash, 0, "drop") is None  # both episodes failed: the group fails
        assert [(t.finish_reason, t.env_info["error_stage"]) for t in seen] == [("error", "harness")] * 2
        assert all("status 3" in t.env_info["error"] and t.env_info["calls"] == 1 for t in seen)
        seen.clear()
        crash.harness_errors = "zero"  # the program failed after calling the model: the policy's failure
        group = await rollouts.play_group(crash, 0, "zero")
        assert len(group) == 2 and all(t.reward == 0.0 and t.num_model_tokens > 0 for t in group)
        assert all(t.finish_reason == "terminated" and "status 3" in t.env_info["harness_error"] for t in seen)
        seen.clear()
        never = TaskConfig(env="Letters-v0", harness=command(NO_CALL), harness_errors="zero")
        assert await rollouts.play_group(never, 0, "no-call") is None  # nothing the policy did: still an error
        assert all(t.finish_reason == "error" and "never called the model" in t.env_info["error"] for t in seen)
    finally:
        await rollouts.close()
        await engine.close()
