"""One run per directory (trainer/run/run_dir.py): what counts as a run, the refusal, and what --overwrite removes."""

import pytest

from envhub.errors import ConfigError
from envhub.trainer.run.run_dir import RunDirTaken, claim_run_dir, holds_run


def test_a_directory_with_only_a_config_or_nothing_is_free(tmp_path):
    claim_run_dir(tmp_path / "new", resume=False, overwrite=False)  # does not exist yet
    (tmp_path / "config.json").write_text("{}")  # a run that stopped at its preflight wrote only this
    claim_run_dir(tmp_path, resume=False, overwrite=False)
    assert holds_run(tmp_path) == []


@pytest.mark.parametrize("marker", ["metrics.jsonl", "episodes.000001.jsonl", "eval.json", "sft.jsonl"])
def test_any_trace_of_a_run_is_refused_with_both_ways_on(tmp_path, marker):
    (tmp_path / marker).write_text("x\n")
    with pytest.raises(RunDirTaken, match=marker) as refused:
        claim_run_dir(tmp_path, resume=False, overwrite=False)
    assert "--resume" in refused.value.hint and "--overwrite" in refused.value.hint
    assert (tmp_path / marker).read_text() == "x\n"
    claim_run_dir(tmp_path, resume=True, overwrite=False)  # resuming is what the directory is for


def test_overwrite_removes_what_the_trainer_wrote_and_nothing_else(tmp_path):
    for name in ("metrics.jsonl", "episodes.jsonl", "episodes.000001.jsonl", "latest", "config.json", "mine.txt"):
        (tmp_path / name).write_text("x")
    for folder in ("checkpoints/step_000002", "eval-after", "tb", "data"):
        (tmp_path / folder).mkdir(parents=True)
    claim_run_dir(tmp_path, resume=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "mine.txt"]
    with pytest.raises(ConfigError, match="contradict"):
        claim_run_dir(tmp_path, resume=True, overwrite=True)
