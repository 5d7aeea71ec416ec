"""The run record: every episode of a real (tiny) training run in episodes.jsonl, turn by turn, with its group's
fate."""

import json

import pytest

from envhub.trainer.config import config_from_dict
from envhub.trainer.run.record import OUTCOMES, EpisodeRecorder, cap_text, episode_files, read_episodes
from envhub.trainer.train import Trainer
from envhub.trainer.trajectory import Trajectory

pytest.importorskip("envhub.trainer.engines.embedded.engine")


def _trajectory(group_id="0-1", reward=1.0, observation="obs", finish="terminated"):
    return Trajectory(
        input_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        behavior_logprobs=[0.0, -0.5, -0.1],
        versions=[-1, 3, 4],
        reward=reward,
        task="Math-v0",
        group_id=group_id,
        seed=7,
        turns=1,
        finish_reason=finish,
        turn_log=[
            {"kind": "reset", "observation": "question?", "env_s": 0.01},
            {
                "kind": "turn",
                "text": 'ok <tool_call>{"name": "submit", "arguments": {"answer": "4"}}</tool_call>',
                "generate_s": 0.5,
                "env_s": 0.02,
                "observation": observation,
                "reward": reward,
            },
        ],
    )


def test_episode_line_has_turns_tool_calls_capped_observation_and_group_outcome(tmp_path):
    recorder = EpisodeRecorder(tmp_path, observation_cap=100)
    recorder.episode(_trajectory(observation="x" * 250), step=3)
    # flushed at once: readable while the recorder is still open (a crash now loses nothing)
    (episode,) = read_episodes(tmp_path)
    assert episode["group_outcome"] is None and episode["policy_versions"] == [3, 4] and episode["seed"] == 7
    turn = episode["log"][1]
    assert turn["tool_calls"] == [{"name": "submit", "arguments": {"answer": "4"}}]
    assert turn["observation"].startswith("x" * 100) and "150 more characters not recorded" in turn["observation"]
    assert episode["generate_s"] == 0.5 and episode["env_s"] == pytest.approx(0.03)
    recorder.group("0-1", "Math-v0", "trained", 4)
    recorder.close(step=4)
    assert read_episodes(tmp_path)[0]["group_outcome"] == "trained"
    metrics = recorder.task_metrics()["Math-v0"]
    assert metrics["episodes"] == 1 and metrics["success_rate"] == 1.0 and metrics["groups_trained"] == 1


def test_success_is_the_envs_verdict_before_the_return(tmp_path):
    recorder = EpisodeRecorder(tmp_path)
    solved_below_one = _trajectory(reward=0.944)  # MiniGrid: solved, reward 1 - 0.9 * steps / max_steps
    solved_below_one.env_info = {"success": True}
    by_progress = _trajectory(reward=0.5)
    by_progress.env_info = {"progress": 100.0}
    failed_at_one = _trajectory(reward=1.0)  # a return of 1 that the env itself calls a failure
    failed_at_one.env_info = {"success": False}
    no_verdict = _trajectory(reward=1.0)
    for t in (solved_below_one, by_progress, failed_at_one, no_verdict):
        recorder.episode(t, step=1)
    assert recorder.task_metrics()["Math-v0"]["success_rate"] == 0.75
    recorder.close(step=1)


async def test_a_rollout_keeps_the_envs_last_verdict_in_env_info(tmp_path):
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Corridor-v0", "kwargs": {"length": 1, "max_turns": 3}}],
            "rollout": {"group_size": 2, "max_new_tokens": 2, "max_turns": 3},
            "algorithm": {"groups_per_step": 1, "filter_zero_variance": False},
            "budget": {"steps": 1, "checkpoint_every": 100},
            "out_dir": str(tmp_path),
        }
    )
    await Trainer(config).run()
    episodes = read_episodes(tmp_path)
    assert episodes and all(e["env_info"]["success"] == (e["reward"] == 1.0) for e in episodes)
    assert all(e["env_info"]["success"] is False for e in episodes if e["finish_reason"] != "terminated")


def test_groups_still_in_flight_are_marked_unfinished_and_cancelled_spares_not_counted(tmp_path):
    recorder = EpisodeRecorder(tmp_path)
    recorder.episode(_trajectory("a", reward=0.0), step=0)
    recorder.episode(_trajectory("a", finish="cancelled"), step=0)
    recorder.close(step=0)
    outcomes = [e["group_outcome"] for e in read_episodes(tmp_path)]
    assert outcomes == ["unfinished", "cancelled"]
    assert recorder.task_metrics()["Math-v0"]["episodes"] == 1


def test_file_rotates_into_numbered_shards_and_reader_reads_them_in_order(tmp_path):
    recorder = EpisodeRecorder(tmp_path, max_bytes=2000)
    for i in range(12):
        recorder.episode(_trajectory(f"g{i}"), step=i)
    recorder.close(step=12)
    files = episode_files(tmp_path)
    assert len(files) > 2 and files[-1].name == "episodes.jsonl" and files[0].name == "episodes.000001.jsonl"
    episodes = read_episodes(tmp_path)
    assert [e["group_id"] for e in episodes] == [f"g{i}" for i in range(12)]
    assert all(e["group_outcome"] == "unfinished" for e in episodes)


def test_cap_text_keeps_short_text():
    assert cap_text("short", 10) == "short"


async def test_training_run_records_every_episode_with_its_group_fate_and_per_task_metrics(tmp_path):
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Letters-v0"}, {"env": "GuessNumberTest-v0"}],
            "rollout": {"group_size": 3, "redundancy": 1, "max_new_tokens": 4, "max_turns": 2},
            "algorithm": {"groups_per_step": 2, "lr": 0.01, "filter_zero_variance": True},
            "budget": {"steps": 2, "checkpoint_every": 5},
            "out_dir": str(tmp_path),
        }
    )
    trainer = Trainer(config)
    progress = []
    trainer.on_progress = progress.append
    result = await trainer.run()
    assert result.last_step == 2
    episodes = read_episodes(tmp_path)
    groups = {}
    for e in episodes:
        groups.setdefault(e["group_id"], []).append(e)
        assert e["task"] in ("Letters-v0", "GuessNumberTest-v0")
        assert e["group_outcome"] in OUTCOMES + ("cancelled",)
        assert e["log"][0]["kind"] == "reset" and e["log"][0]["observation"]
        if e["finish_reason"] != "cancelled":
            turns = [t for t in e["log"] if t["kind"] == "turn"]
            assert len(turns) == e["turns"] >= 1 and all("text" in t and "generate_s" in t for t in turns)
    trained = [g for g, es in groups.items() if es[0]["group_outcome"] == "trained"]
    assert len(trained) == 4  # 2 steps x 2 groups
    for g in trained:  # group of 3 kept, the over-provisioned spare (if it did not finish first) cancelled
        kept = [e for e in groups[g] if e["finish_reason"] != "cancelled"]
        assert len(kept) >= 3
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert sum(last.get(f"tasks/{t}/groups_trained", 0) for t in ("Letters-v0", "GuessNumberTest-v0")) == 4
    assert any(k.endswith("/success_rate") for k in last)
    assert progress and {
        "episodes_running",
        "episodes_done",
        "groups_accepted",
        "groups_filtered",
        "tokens_per_s",
    } <= set(progress[-1])
