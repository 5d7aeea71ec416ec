"""The training loop end to end on a tiny model: metrics, checkpoints, resume, Ctrl-C, learning."""

import copy
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from envhub.trainer.config import config_from_dict
from envhub.trainer.learner.checkpoint import latest_checkpoint
from envhub.trainer.run.run_dir import RunDirTaken
from envhub.trainer.train import Trainer

pytest.importorskip("envhub.trainer.engines.embedded.engine")

REPO = Path(__file__).resolve().parents[2]


def tiny_config(out_dir, **algorithm):
    return config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Letters-v0"}],
            "rollout": {"group_size": 4, "max_new_tokens": 4, "max_turns": 1},
            "algorithm": {"groups_per_step": 2, "lr": 0.01, **algorithm},
            "budget": {"steps": 2, "checkpoint_every": 1},
            "out_dir": str(out_dir),
        }
    )


async def test_run_writes_metrics_curve_and_checkpoints_then_resumes_at_next_step(tmp_path):
    config = tiny_config(tmp_path)
    first = await Trainer(config).run()
    assert (first.first_step, first.last_step, first.interrupted) == (0, 2, False)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(0.0 <= r["reward/Letters-v0"] <= 1.0 for r in rows)
    # where the CPUs went since the run was prepared: counters that only grow, the machine's holding the trainer's
    assert 0 < rows[0]["trainer_cpu_s"] <= rows[1]["trainer_cpu_s"] <= rows[1]["machine_cpu_s"] + 0.05
    assert rows[0]["machine_cpu_s"] <= rows[1]["machine_cpu_s"] and all(0 < r["machine_busy"] <= 1.05 for r in rows)
    assert (tmp_path / "reward_curve.png").stat().st_size > 1000 and list((tmp_path / "tb").iterdir())
    # where each step's time went (the learner, the push, the wait) and the engine's decode rate in the interval
    assert all(0 < r["time/learner_s"] <= r["time/learner_s"] + r["time/push_s"] <= r["time/interval_s"] for r in rows)
    assert all(r["time/wait_s"] <= r["time/interval_s"] and r["time/generate_s"] > 0 for r in rows)
    assert rows[0]["engine/decode_tokens_per_s"] > 0 and rows[0]["engine/busy_s"] > rows[0]["engine/prefill_s"] > 0
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert list(stages["stages_s"]) == ["engine start", "rl"] and stages["rl_steps"] == 2
    assert stages["rl_steps_per_minute"] > 0 and stages["rl_step_means"]["time/learner_s"] > 0
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.step == 2 and (ckpt.path / "model.safetensors").exists() and (ckpt.path / "optimizer.pt").exists()
    assert ckpt.state["queue"]["version"] == 2 and ckpt.state["queue"]["consumed"] == 4

    # a new run into this directory is refused, and the run there is left as it was
    before = {name: (tmp_path / name).read_bytes() for name in ("metrics.jsonl", "episodes.jsonl", "latest")}
    with pytest.raises(RunDirTaken, match="already holds a run") as refused:
        await Trainer(config).run()
    assert "--resume" in refused.value.hint and "--overwrite" in refused.value.hint
    assert before == {name: (tmp_path / name).read_bytes() for name in before}

    # the checkpoint is a Hugging Face model directory
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(ckpt.path)
    config.budget.steps = 3
    resumed_trainer = Trainer(config)
    seen = {}

    async def spy_run():
        from envhub.trainer.run import resume as resume_module

        original = resume_module.load_checkpoint

        def capture(checkpoint, model, optimizer):
            original(checkpoint, model, optimizer)
            seen["params"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            seen["optimizer"] = copy.deepcopy(optimizer.state_dict())

        resume_module.load_checkpoint = capture
        try:
            return await resumed_trainer.run(resume=True)
        finally:
            resume_module.load_checkpoint = original

    second = await spy_run()
    assert (second.first_step, second.last_step) == (2, 3)
    for name, tensor in saved.state_dict().items():
        assert torch.equal(seen["params"][name], tensor), name
    saved_opt = torch.load(ckpt.path / "optimizer.pt", weights_only=False)
    assert all(
        torch.equal(seen["optimizer"]["state"][k]["exp_avg"].cpu(), saved_opt["state"][k]["exp_avg"].cpu())
        for k in saved_opt["state"]
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["queue/consumed"] == 6

    # --overwrite: a new run from step 1, none of the old run's rows, checkpoints or evaluations beside it
    (tmp_path / "notes.txt").write_text("mine")
    config.budget.steps = 1
    third = await Trainer(config).run(overwrite=True)
    assert (third.first_step, third.last_step) == (0, 1)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]
    assert (tmp_path / "notes.txt").read_text() == "mine"  # only what the trainer writes is deleted


async def test_sync_mode_never_trains_on_stale_groups(tmp_path):
    result = await Trainer(tiny_config(tmp_path, mode="sync", max_staleness=3)).run()
    assert all(r["staleness"] == 0 for r in result.history)


def test_sigint_leaves_a_usable_checkpoint(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model: {name: tiny}\ntasks: [{env: Letters-v0}]\nrollout: {group_size: 4, max_new_tokens: 4, max_turns: 1}\n"
        f"algorithm: {{groups_per_step: 2, lr: 0.01}}\nbudget: {{steps: 10000, checkpoint_every: 100000}}\nout_dir: "
        f"{tmp_path / 'run'}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub.cli.main", "train", str(cfg)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, (
            proc.stderr.read() if proc.poll() is not None else "no step"
        )
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.step >= 2
    done = len(metrics.read_text().splitlines())
    assert ckpt.step == done  # the checkpoint holds the last finished step
    resumed = subprocess.run(
        [sys.executable, "-m", "envhub.cli.main", "train", str(cfg), "--resume", "--steps", str(done + 1)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(metrics.read_text().splitlines()[-1])["step"] == done + 1
    # stderr is a pipe, not a terminal: one plain line a step, no progress-bar redraws
    assert "step 1/10000 reward" in err and "\r" not in err + resumed.stderr
    assert f"step {done + 1}/{done + 1} reward" in resumed.stderr


async def test_a_stop_requested_before_rl_is_an_interrupt_even_when_the_time_budget_is_spent(tmp_path, monkeypatch):
    """Ctrl-C during the demo's SFT stage, whose SFT and evaluation then spent max_run_s: the run reported "time budget
    spent", ran the final evaluation (5 minutes more) and exited 0, as if no Ctrl-C had come."""
    trainer = Trainer(tiny_config(tmp_path))
    trainer.request_stop()  # what Ctrl-C does, here before the first step
    monkeypatch.setattr(Trainer, "_out_of_time", lambda self, run: True)
    result = await trainer.run()
    assert (result.interrupted, result.stop_reason, result.last_step) == (True, "interrupted", 0)


async def test_a_run_that_trained_no_rl_step_does_not_evaluate_the_same_weights_again(tmp_path, monkeypatch, capsys):
    """Seen under load: the demo's SFT and its evaluation spent max_run_s, RL fitted 0 steps, and the run spent 5
    more minutes evaluating the SFT weights a second time."""
    config = tiny_config(tmp_path)
    config.evaluation.episodes = 2
    monkeypatch.setattr(Trainer, "_out_of_time", lambda self, run: True)
    result = await Trainer(config).run()
    assert (result.interrupted, result.last_step) == (False, 0)
    assert "the weights of 'before' again; skipped" in capsys.readouterr().out
    assert "after" not in json.loads((tmp_path / "eval.json").read_text())["overall"]


@pytest.mark.slow
async def test_mean_reward_rises_clearly_in_forty_steps(tmp_path):
    config = config_from_dict(
        {
            "model": {"name": "tiny"},
            "tasks": [{"env": "Letters-v0", "kwargs": {"letters": "aeiou"}}],
            "rollout": {"group_size": 8, "max_new_tokens": 6, "max_turns": 1, "concurrent_groups": 4},
            "algorithm": {"mode": "async", "groups_per_step": 4, "lr": 0.015, "max_staleness": 1},
            "budget": {"steps": 40, "checkpoint_every": 1000},  # steps, not seconds: the machine may be slow
            "out_dir": str(tmp_path),
        }
    )
    started = time.monotonic()
    trainer = Trainer(config)
    rewards: list[float] = []

    def rise() -> tuple[float, float]:
        early = sum(rewards[:3]) / 3
        return early, max(sum(rewards[i : i + 3]) / 3 for i in range(3, len(rewards) - 2))  # best later 3-step window

    def on_step(row: dict) -> None:  # the claim holds once shown: the rest of the 40 steps would only cost CI time
        rewards.append(row["batch_reward"])
        if len(rewards) >= 6:
            early, late = rise()
            if late > early + 0.08:
                trainer.request_stop()

    trainer.on_step = on_step
    result = await trainer.run()
    early, late = rise()
    print(f"reward {early:.3f} -> {late:.3f} in {time.monotonic() - started:.1f}s over {result.last_step} steps")
    assert result.last_step <= 40 and late > early + 0.08, rewards  # seen: 0.37 -> 0.49..0.58 in 25-35 s


async def test_a_fractional_staleness_bound_trains_on_batches_part_one_version_old(tmp_path):
    config = tiny_config(tmp_path, mode="async", max_staleness=0.5)  # 1 of the 2 groups a step may start early
    config.budget.steps, config.budget.checkpoint_every, config.rollout.concurrent_groups = 6, 100, 4
    config.algorithm.filter_zero_variance = False  # a collapsed policy keeps training: every run takes its 6 steps
    result = await Trainer(config).run()
    lags = [r["staleness"] for r in result.history]
    assert result.last_step == 6 and all(0 <= lag <= 1 for lag in lags), lags
    # whole-step async would train on batches one version old from step 2 on (mean 1); sync on none (0)
    assert 0.2 < sum(lags[1:]) / len(lags[1:]) < 0.8, lags


def test_off_policy_warning_names_the_clipped_stale_steps_and_the_fix():
    from envhub.trainer.run.metrics import off_policy_warning

    clipped = {
        "staleness": 1.0,
        "learner/ppo_clip_low_fraction": 0.90,
        "learner/ppo_clip_high_fraction": 0.05,
        "learner/kl_behavior": 1895.0,
    }
    fine = dict(clipped, **{"learner/ppo_clip_low_fraction": 0.01, "learner/ppo_clip_high_fraction": 0.01})
    message = off_policy_warning([fine, clipped, clipped, clipped], "async")
    assert message is not None and "95%" in message and "pg_variant: vanilla" in message and "1.9e+03" in message
    assert off_policy_warning([clipped, clipped, clipped], "sync") is None  # sync samples are never stale
    assert off_policy_warning([clipped, clipped, fine], "async") is None  # a step that learned: no warning
    assert off_policy_warning([clipped, clipped], "async") is None  # too early to tell
    # the trainer's own history rows nest the learner's statistics: the warning must read them there too
    nested = {
        "staleness": 1.0,
        "learner": {"ppo_clip_low_fraction": 0.90, "ppo_clip_high_fraction": 0.05, "kl_behavior": 1895.0},
    }
    assert "95%" in off_policy_warning([nested] * 3, "async")
    on_policy = dict(clipped, staleness=0.0)
    assert off_policy_warning([on_policy] * 3, "async") is None
    # no ppo ratio to clip: other variants log their own statistics, never ppo's; the generic clip_fraction (the
    # ratio to the behaviour policy, whatever the variant) is high on stale steps yet discards nothing there
    vanilla = {"staleness": 1.0, "learner/clip_fraction": 0.95, "learner/kl_behavior": 1895.0}
    assert off_policy_warning([vanilla] * 3, "async") is None
    # ppo under is_correction with apply_weight: its ratio is anchored at the proximal policy, which the staleness
    # does not reach, so its own clip share stays small even where the ratio to the behaviour policy is far off
    reanchored = dict(fine, **{"learner/clip_fraction": 0.95})
    assert off_policy_warning([reanchored] * 3, "async") is None


async def test_a_crash_mid_run_keeps_the_checkpoint_and_skips_the_final_evaluation(tmp_path, monkeypatch):
    from envhub.trainer.learner.step import Learner

    config = tiny_config(tmp_path)
    config.budget.steps, config.budget.checkpoint_every, config.evaluation.episodes = 5, 100, 2
    gathered = []
    original_state = Learner.engine_state
    monkeypatch.setattr(
        Learner, "engine_state", lambda self, dtype=None: gathered.append(dtype) or original_state(self, dtype)
    )
    original_row = Trainer._row

    def row_then_crash(self, run, *args):
        if run.step == 2:
            raise RuntimeError("metrics backend died")
        return original_row(self, run, *args)

    monkeypatch.setattr(Trainer, "_row", row_then_crash)
    with pytest.raises(RuntimeError, match="metrics backend died"):
        await Trainer(config).run()
    assert latest_checkpoint(tmp_path).step == 2  # the step that was taken is saved on the way out
    assert torch.float32 not in gathered  # no final-evaluation gather (a collective) after a crash
    report = json.loads((tmp_path / "eval.json").read_text())
    assert "before" in report["overall"] and "after" not in report["overall"]
