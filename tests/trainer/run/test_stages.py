"""Where a run's time went: stages timed in order and written as they end, RL's rate and mean step, and the line that
says a time budget fitted fewer than half the configured steps."""

from __future__ import annotations

import json

import pytest

from envhub.trainer.run.stages import StageClock


def rows(n: int, interval: float = 10.0) -> list[dict]:
    return [
        {"time/interval_s": interval, "time/learner_s": 6.0, "time/wait_s": 3.5, "time/push_s": 0.5}
        | {"time/idle_s": None, "engine/decode_tokens_per_s": 100.0 + i}
        for i in range(n)
    ]


def test_stages_are_written_in_order_as_each_ends_even_one_that_raised(tmp_path):
    clock = StageClock(tmp_path)
    with clock.stage("evaluation before"):
        pass
    assert list(json.loads((tmp_path / "stages.json").read_text())["stages_s"]) == ["evaluation before"]
    with pytest.raises(RuntimeError), clock.stage("sft"):
        raise RuntimeError("SFT failed")
    clock.start_rl()
    clock.end_rl(4, rows(4))
    report = json.loads((tmp_path / "stages.json").read_text())
    assert list(report["stages_s"]) == ["evaluation before", "sft", "rl"] and report["rl_steps"] == 4
    means = report["rl_step_means"]
    assert means["time/learner_s"] == 6.0 and means["engine/decode_tokens_per_s"] == 101.5
    assert "time/idle_s" not in report["rl_step_means"]  # an engine that counts no busy time has no idle figure


def test_the_summary_names_each_stage_and_a_mean_rl_step(tmp_path):
    clock = StageClock(tmp_path)
    clock.stages = {"evaluation before": 120.0, "sft": 60.0}
    clock.start_rl()
    clock.end_rl(3, rows(3))
    clock.stages["rl"] = 60.0  # as if RL took a minute
    clock.rl_steps = 3
    text = clock.summary()
    assert "evaluation before 120s | sft 60s | rl 60s | total 240s" in text
    assert "rl: 3 steps, 3.00 per minute; a step 10.0s: learner 6.0s, push 0.5s, wait 3.5s" in text
    assert "engine decode 101 tok/s" in text


def test_a_budget_that_fits_under_half_the_steps_says_so_with_the_figures(tmp_path):
    clock = StageClock(tmp_path)
    clock.start_rl()
    clock.end_rl(9, rows(9, interval=40.0))
    line = clock.shortfall(configured_steps=24, max_time_s=360)
    assert line is not None and "RL fitted 9 of its 24 configured steps (budget.max_time_s = 360s of RL)" in line
    assert "at 40.0s a step (learner 6.0s, waiting for episodes 3.5s); 24 steps need about 960s" in line
    assert clock.shortfall(configured_steps=18, max_time_s=360) is None  # half fitted: nothing to say
    assert clock.shortfall(configured_steps=24, max_time_s=0) is None  # no time budget: steps ended it
    clock.stages["rl"] = 200.0
    capped = clock.shortfall(configured_steps=24, max_time_s=0, max_run_s=720)
    assert capped is not None and "(budget.max_run_s = 720s in all, RL had 200s)" in capped


def test_the_final_evaluation_is_reserved_the_latest_evaluations_time_with_a_margin(tmp_path):
    clock = StageClock(tmp_path)
    assert clock.final_evaluation_reserve() == 0.0  # no evaluation yet: nothing to go by
    clock.stages.update({"evaluation before": 300.0, "sft": 150.0, "evaluation sft": 120.0})
    assert clock.final_evaluation_reserve() == pytest.approx(150.0)  # the latest one, x 1.25


def test_timed_out_training_episodes_are_named_at_the_end_with_the_fix():
    from envhub.trainer.run.stages import timeouts_line

    row = {"queue": {"timed_out_episodes": 23, "timed_out_groups": 1, "accepted": 3}}
    line = timeouts_line(row, 120.0)
    assert line.startswith("23 training episodes passed rollout.episode_timeout_s (120 s)") and "1 groups" in line
    assert timeouts_line({"queue": {"timed_out_episodes": 0}}, 120.0) is None
    assert timeouts_line(None, 120.0) is None  # no step was trained
