"""benchmarks/learning_parity.py: config overrides, the across-seed summary, and one real tiny run of both modes."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.errors import ConfigError
from envhub.trainer.staleness import Staleness

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("learning_parity", ROOT / "benchmarks" / "learning_parity.py")
parity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parity)


def test_set_overrides_reach_the_config_and_mode_seed_steps_win():
    config = parity.build_config(
        str(ROOT / "configs" / "ci-tiny.yaml"),
        ["algorithm.lr=2e-3", "rollout.group_size=4"],
        mode="sync",
        seed=7,
        steps=3,
        eval_episodes=5,
        temperature=0.0,
    )
    assert config.algorithm.lr == pytest.approx(2e-3) and config.rollout.group_size == 4
    assert (config.algorithm.mode, config.seed, config.budget.steps, config.budget.checkpoint_every) == (
        "sync",
        7,
        3,
        3,
    )
    assert (config.evaluation.episodes, config.evaluation.temperature) == (5, 0.0)
    assert config.budget.max_time_s == 0  # equal steps: the config's time limit would cut the slower mode short
    timed = parity.build_config(
        str(ROOT / "configs" / "parity-smollm2.yaml"),
        [],
        mode="async",
        seed=0,
        steps=3,
        eval_episodes=5,
        temperature=0.0,
        max_time_s=60,
    )
    assert timed.budget.max_time_s == 60


def test_a_number_in_an_override_names_an_item_of_a_list():
    config = parity.build_config(
        str(ROOT / "configs" / "credit-frozenlake.yaml"),
        ["tasks.0.kwargs.random_ends=false", "tasks.0.kwargs.hole_fraction=0.2"],
        mode="async",
        seed=0,
        steps=1,
        eval_episodes=1,
        temperature=0.0,
    )
    kwargs = config.tasks[0].kwargs
    assert (kwargs["random_ends"], kwargs["hole_fraction"], kwargs["neighbours"]) == (False, 0.2, True)


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("algorithm.lr", "not KEY=VALUE"),
        ("seed.x=1", "'seed' is not a section"),
        ("tasks.1.kwargs.size=4", "'1' is not an item of a list of 1"),
        ("tasks.first.weight=2", "'first' is not an item of a list of 1"),
        ("tasks.0.env.x=1", "'env' is not a section"),
        ("algorithm.lrr=1", "lrr"),
    ],
)
def test_bad_overrides_are_named(assignment, message):
    with pytest.raises(ConfigError, match=message):
        parity.build_config(
            str(ROOT / "configs" / "ci-tiny.yaml"),
            [assignment],
            mode="sync",
            seed=0,
            steps=1,
            eval_episodes=1,
            temperature=1.0,
        )


def test_summary_pairs_seeds_and_reports_standard_errors():
    runs = {
        "sync": [
            {"seed": 0, "eval_after": 0.5, "wall_s": 10.0, "steps": 4},
            {"seed": 1, "eval_after": 0.7, "wall_s": 12.0, "steps": 4},
        ],
        "async": [
            {"seed": 0, "eval_after": 0.6, "wall_s": 6.0, "steps": 4},
            {"seed": 1, "eval_after": 0.6, "wall_s": 5.0, "steps": 4},
        ],
    }
    summary = parity.summarise(runs)
    assert summary["sync"]["eval_after_mean"] == pytest.approx(0.6)
    assert summary["sync"]["eval_after_se_over_seeds"] == pytest.approx(0.1)
    assert summary["after_async_minus_sync_by_seed"] == pytest.approx([0.1, -0.1])
    assert summary["after_async_minus_sync"] == pytest.approx(0.0)  # paired: +0.1 and -0.1
    assert summary["after_async_minus_sync_se"] == pytest.approx(0.1)
    assert summary["parity_within_one_se"] and summary["equal_steps"]
    assert summary["wall_async_over_sync"] == pytest.approx(5.5 / 11.0)
    assert summary["speedup_sync_over_async"] == pytest.approx(2.0)
    assert parity.mean_se([0.3]) == (0.3, 0.0)


def test_pairing_removes_the_seed_effect_that_unpaired_errors_keep():
    # seeds differ a lot (0.2 .. 0.8) but async trails sync by 0.10-0.14 on every seed: the paired SE sees a
    # consistent loss that the modes' overlapping per-mode SEs would hide
    sync = [0.2, 0.5, 0.8]
    async_ = [0.1, 0.38, 0.66]
    runs = {
        mode: [
            {"seed": i, "eval_after": v, "wall_s": 1.0, "steps": 3 + (mode == "async" and i == 2)}
            for i, v in enumerate(values)
        ]
        for mode, values in (("sync", sync), ("async", async_))
    }
    summary = parity.summarise(runs)
    diffs = [-0.10, -0.12, -0.14]
    mean = sum(diffs) / 3
    se = (sum((d - mean) ** 2 for d in diffs) / 2 / 3) ** 0.5
    assert summary["after_async_minus_sync"] == pytest.approx(mean)
    assert summary["after_async_minus_sync_se"] == pytest.approx(se)  # 0.0115, far below the per-mode SE 0.17
    assert summary["sync"]["eval_after_se_over_seeds"] > 10 * se
    assert not summary["parity_within_one_se"]
    assert not summary["equal_steps"]  # one async run took 4 steps


def test_summary_refuses_runs_that_do_not_pair():
    runs = {
        "sync": [{"seed": 0, "eval_after": 0.5, "wall_s": 1.0, "steps": 2}],
        "async": [{"seed": 1, "eval_after": 0.5, "wall_s": 1.0, "steps": 2}],
    }
    with pytest.raises(ValueError, match="same seeds"):
        parity.summarise(runs)


def report(seeds, sync_after, async_after, **settings):
    """A result file as the benchmark writes it: header, runs of both modes with per-task figures."""
    runs = {
        mode: [
            {
                "seed": seed,
                "eval_after": value,
                "wall_s": 2.0 if mode == "sync" else 1.0,
                "steps": 3,
                "per_task_after": {"Lake": value, "Math": 0.5},
            }
            for seed, value in zip(seeds, values)
        ]
        for mode, values in (("sync", sync_after), ("async", async_after))
    }
    header = {key: None for key in parity.SETTINGS} | {"config": "configs/demo.yaml", "steps": 3} | settings
    return {**header, "seeds": list(seeds), "complete": True, "runs": runs}


def test_merge_is_one_comparison_over_the_seeds_of_every_file():
    merged = parity.merge_results(
        [("b.json", report([3, 4], [0.5, 0.6], [0.6, 0.4])), ("a.json", report([0], [0.2], [0.3]))]
    )
    assert merged["seeds"] == [0, 3, 4] and [r["seed"] for r in merged["runs"]["async"]] == [0, 3, 4]
    assert merged["after_async_minus_sync_by_seed"] == pytest.approx([0.1, 0.1, -0.2])
    assert merged["after_async_minus_sync"] == pytest.approx(0.0)
    assert merged["after_async_minus_sync_se"] == pytest.approx(0.1)  # sd 0.1732 over sqrt(3)
    lake = merged["per_task_async_minus_sync"]["Lake"]
    assert lake["by_seed"] == pytest.approx([0.1, 0.1, -0.2]) and lake["mean"] == pytest.approx(0.0)
    assert merged["per_task_async_minus_sync"]["Math"]["se"] == 0.0
    assert merged["speedup_sync_over_async"] == pytest.approx(2.0) and merged["merged_from"] == ["b.json", "a.json"]


def test_merge_keeps_the_finished_seeds_of_an_interrupted_file():
    interrupted = report([1, 2], [0.5, 0.7], [0.4])  # seed 2 finished sync only
    interrupted["complete"] = False
    merged = parity.merge_results([("x.json", interrupted), ("y.json", report([5], [0.1], [0.3]))])
    assert merged["seeds"] == [1, 5] and merged["after_async_minus_sync_by_seed"] == pytest.approx([-0.1, 0.2])


@pytest.mark.parametrize(
    "second, message",
    [
        (report([1], [0.5], [0.5], steps=4), "differ in steps: 4 vs 3"),
        (report([1], [0.5], [0.5], overrides=["algorithm.lr=1e-5"]), "differ in overrides"),
        (report([0], [0.5], [0.5]), "seed 0 is in both a.json and b.json"),
    ],
)
def test_merge_refuses_files_that_are_not_one_comparison(second, message):
    with pytest.raises(ConfigError, match=message):
        parity.merge_results([("a.json", report([0], [0.2], [0.3])), ("b.json", second)])


def test_merge_on_the_command_line_writes_the_summary_and_names_a_bad_file(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(report([0], [0.2], [0.3])))
    (tmp_path / "b.json").write_text(json.dumps(report([1], [0.6], [0.4])))
    (tmp_path / "bad.json").write_text("{not json")
    out = tmp_path / "out" / "merged.json"

    def merge(*names):
        return subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "learning_parity.py"), "--merge", *names, "--out", str(out)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = merge("a.json", "b.json")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(out.read_text())["seeds"] == [0, 1] and "Lake" in ok.stdout
    bad = merge("a.json", "bad.json")
    assert bad.returncode == 1 and "bad.json: cannot read it as a result file" in bad.stderr
    (tmp_path / "list.json").write_text("[1, 2]")
    other = merge("a.json", "list.json")
    assert other.returncode == 1 and "list.json: not a learning_parity result" in other.stderr


def test_variant_and_correction_reach_both_modes_and_staleness_only_async():
    configs = {
        mode: parity.build_config(
            str(ROOT / "configs" / "ci-tiny.yaml"),
            [],
            mode=mode,
            seed=0,
            steps=2,
            eval_episodes=2,
            temperature=1.0,
            variant="topr",
            max_staleness=3,
            is_correction="sequence",
        )
        for mode in ("sync", "async")
    }
    for config in configs.values():
        assert config.algorithm.pg_variant == "topr" and config.algorithm.is_correction.level == "sequence"
        assert not config.algorithm.filter_zero_variance  # equal steps: no converged / collapsed early stop
    assert configs["async"].algorithm.max_staleness == 3
    assert configs["sync"].algorithm.max_staleness == 0.5  # the config's; sync runs at staleness 0 regardless


def test_ci_tiny_trained_async_takes_its_half_step_bound():
    config = parity.build_config(
        str(ROOT / "configs" / "ci-tiny.yaml"), [], mode="async", seed=0, steps=2, eval_episodes=2, temperature=1.0
    )
    staleness = Staleness.from_config(config.algorithm)  # the bound that matched sync over 40 seeds
    assert staleness.max_staleness == 0.5 and staleness.groups_ahead(config.algorithm.groups_per_step) == 2
    assert staleness.version_bound == 1


def test_the_demo_config_builds_with_its_sft_stage():
    config = parity.build_config(
        str(ROOT / "configs" / "demo.yaml"),
        [],
        mode="sync",
        seed=1,
        steps=4,
        eval_episodes=8,
        temperature=0.0,
    )
    assert config.model.name == "smollm2" and config.sft.collect > 0 and len(config.tasks) == 3
    assert (config.budget.steps, config.budget.max_time_s, config.algorithm.mode) == (4, 0, "sync")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seeds", "0,0"], "repeated"),
        (["--steps", "0"], "at least 1"),
        (["--max-staleness", "-1"], "0 or more"),
        (["--variant", "grpo"], "invalid choice"),
        (["--seeds", "a"], "comma-separated integers"),
    ],
)
def test_bad_command_lines_are_refused_before_training(argv, message):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning_parity.py"), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.slow
def test_one_seed_of_both_modes_trains_and_writes_json(tmp_path, monkeypatch, capsys):
    # in this process: a subprocess paid ~4 s importing torch and ~3 s tearing it down, beside the seconds of training
    # (the command line as a process is test_bad_command_lines_are_refused_before_training's and the merge test's)
    monkeypatch.chdir(ROOT)
    out = tmp_path / "parity.json"
    parity.main(
        ["--steps", "2", "--seeds", "0", "--eval-episodes", "4", "--set", "rollout.group_size=4", "--out", str(out)]
    )
    report = json.loads(out.read_text())
    for mode in ("sync", "async"):
        (run,) = report["runs"][mode]
        assert run["steps"] == 2 and 0.0 <= run["eval_after"] <= 1.0 and run["wall_s"] > 0
    assert report["overrides"] == ["rollout.group_size=4"]
    assert report["equal_steps"] and report["after_async_minus_sync_by_seed"] == [
        report["runs"]["async"][0]["eval_after"] - report["runs"]["sync"][0]["eval_after"]
    ]
    assert "async - sync final eval" in capsys.readouterr().out


WARM_CONFIG = """
model: {name: tiny, tiny_layers: 1, tiny_hidden: 32}
engine: {kind: local, max_batch_size: 8}
tasks:
  - env: FrozenLake-v0
    kwargs: {size: 3, spaced: true}
rollout: {group_size: 2, max_turns: 2, max_new_tokens: 8, temperature: 1.0, concurrent_groups: 2}
algorithm: {mode: sync, groups_per_step: 2, lr: 0.001}
sft: {collect: 2, max_tokens: 256, lr: 0.001}
evaluation: {episodes: 2}
seed: 7
"""


def run_parity(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "learning_parity.py"), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_warm_start_runs_sft_once_and_every_run_starts_from_its_checkpoint(tmp_path, monkeypatch, capsys):
    # the benchmark in this process, as in test_one_seed_of_both_modes_trains_and_writes_json
    monkeypatch.chdir(ROOT)
    config = tmp_path / "warm.yaml"
    config.write_text(WARM_CONFIG)
    checkpoint, out = tmp_path / "sft", tmp_path / "parity.json"
    common = ["--config", str(config), "--steps", "1", "--eval-episodes", "2", "--temperature", "0"]
    # one seed per batch: both modes of seed 0 here, and seed 1 in the later batch below, start from the checkpoint
    parity.main([*common, "--seeds", "0", "--warm-start", str(checkpoint), "--out", str(out)])
    stdout = capsys.readouterr().out
    assert stdout.count("sft:") == 1 and "saved the SFT checkpoint" in stdout  # one stage for the two runs
    record = json.loads((checkpoint / "warm_start.json").read_text())
    assert (checkpoint / "config.json").exists() and list(checkpoint.glob("*.safetensors"))
    assert record["seed"] == 7 and record["sft"]["examples"] > 0 and not (tmp_path / "sft.partial").exists()
    assert record["weights_sha256"] == parity.weights_digest(checkpoint)
    report = json.loads(out.read_text())
    assert report["warm_start_weights_sha256"] == record["weights_sha256"]
    assert report["warm_start"]["dir"] == str(checkpoint.resolve()) and report["overrides"] == []
    assert all(run["eval_sft"] is None for run in report["runs"]["sync"])

    # a later batch of seeds reuses it (no second SFT stage) and merges with the first
    second = tmp_path / "parity2.json"
    parity.main([*common, "--seeds", "1", "--warm-start", str(checkpoint), "--out", str(second)])
    stdout = capsys.readouterr().out
    assert "reusing" in stdout and "sft:" not in stdout
    later = json.loads(second.read_text())
    # one checkpoint, greedy held-out episodes: every run of every seed scores it the same before RL
    befores = {
        run["eval_before"] for batch in (report, later) for mode in ("sync", "async") for run in batch["runs"][mode]
    }
    assert len(befores) == 1
    merged = parity.merge_results([("a", report), ("b", later)])
    assert merged["seeds"] == [0, 1]
    with pytest.raises(ConfigError, match="warm_start_weights_sha256"):
        parity.merge_results([("a", report), ("c", {**report, "warm_start_weights_sha256": "0" * 64})])

    # other SFT settings may not reuse it: refused before any training, naming the section (a SystemExit with a
    # message: exit status 1, the message on stderr)
    with pytest.raises(SystemExit, match="made with another sft: section"):
        parity.main([*common, "--set", "sft.lr=0.01", "--warm-start", str(checkpoint), "--out", str(second)])


@pytest.mark.parametrize(
    "setup, message",
    [
        ("none", "no SFT stage"),  # ci-tiny has no sft: section
        ("foreign", "is not a checkpoint this benchmark made"),
        ("broken", "warm_start.json is not JSON"),
    ],
)
def test_warm_start_refuses_what_it_cannot_use_before_training(tmp_path, setup, message):
    checkpoint = tmp_path / "sft"
    config = "configs/ci-tiny.yaml"
    if setup != "none":
        (tmp_path / "warm.yaml").write_text(WARM_CONFIG)
        config = str(tmp_path / "warm.yaml")
        checkpoint.mkdir()
        (checkpoint / ("notes.txt" if setup == "foreign" else "warm_start.json")).write_text("{")
    proc = run_parity("--config", config, "--warm-start", str(checkpoint), "--out", str(tmp_path / "p.json"))
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "p.json").exists()
