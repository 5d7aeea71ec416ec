"""Published formats load as published: SWE-bench's JSON-string test lists, images by each naming scheme."""

import json

import pytest

from envhub.envs.swe.datasets import convert, load_tasks, reverse_patch, swebench_image
from envhub.envs.swe.published import published_row
from envhub.envs.swe.tasks import BUNDLED_TASKS, load_instances
from envhub.errors import ConfigError

BUNDLED = load_instances(BUNDLED_TASKS)


@pytest.mark.parametrize("fmt", ["swebench", "swegym", "r2egym", "swesmith"])
def test_each_format_loads_from_jsonl_with_its_image(tmp_path, fmt):
    row = published_row(BUNDLED[0], fmt)
    path = tmp_path / ("swe-gym.jsonl" if fmt == "swegym" else f"{fmt}.jsonl")
    path.write_text(json.dumps(row) + "\n")
    [inst] = load_tasks(path)
    assert inst.dataset == fmt and inst.workdir == "/testbed"
    expected_image = {
        "swebench": f"swebench/sweb.eval.x86_64.{inst.instance_id.replace('__', '_1776_')}:latest",
        "swegym": f"xingyaoww/sweb.eval.x86_64.{inst.instance_id.replace('__', '_s_')}:latest",
        "r2egym": row.get("docker_image"),
        "swesmith": "jyangballin/swesmith.x86_64."
        + row.get("image_name", "").split(".", 2)[-1].replace("__", "_1776_")
        + ":latest",
    }[fmt]
    assert inst.image == expected_image.lower()
    if fmt in ("swebench", "swegym"):
        assert isinstance(row["FAIL_TO_PASS"], str)  # JSON-encoded, as the published sets ship them
        assert inst.FAIL_TO_PASS == tuple(json.loads(row["FAIL_TO_PASS"])) and inst.version == "0.1"
        assert inst.environment_setup_commit == BUNDLED[0].base_commit
    if fmt == "swesmith":
        assert inst.patch == BUNDLED[0].patch  # the published `patch` is the bug; the fix is its reverse
        assert inst.extra["bug_patch"] == row["patch"]
    if fmt == "r2egym":
        assert set(inst.PASS_TO_PASS) == set(json.loads(row["expected_output_json"]))


def test_parquet_and_round_trip(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [published_row(i, "swebench") for i in BUNDLED[:3]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "verified.parquet")
    loaded = load_tasks(tmp_path / "verified.parquet")
    assert [i.instance_id for i in loaded] == [r["instance_id"] for r in rows]
    assert all(i.dataset == "swebench" and i.image == swebench_image(i.instance_id) for i in loaded)
    # envhub's own JSONL keeps the format, image and workdir
    from envhub.envs.swe.tasks import write_instances

    write_instances(loaded, tmp_path / "normal.jsonl")
    assert load_tasks(tmp_path / "normal.jsonl") == loaded


def test_image_name_is_the_official_harness_name():
    from envhub.envs.swe import official

    if official.harness() is None:
        pytest.skip("swebench (extra `swe`) not installed")
    inst = convert(published_row(BUNDLED[0], "swebench", repo="pylint-dev/astroid", version="3.0"))
    assert inst.image == official.test_spec(inst).instance_image_key


def test_reverse_patch_round_trips_on_every_bundled_patch():
    for inst in BUNDLED:
        assert reverse_patch(reverse_patch(inst.patch)) == inst.patch
        assert reverse_patch(inst.patch) != inst.patch


def test_offline_hub_name_says_what_to_download(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-envhub-test")
    with pytest.raises(ConfigError) as err:
        load_tasks("princeton-nlp/SWE-bench_Verified")
    text = str(err.value)
    assert "princeton-nlp/SWE-bench_Verified" in text and "load_dataset(" in text and ".jsonl" in text


def test_bad_rows_name_the_problem(tmp_path):
    row = published_row(BUNDLED[0], "swebench")
    row["FAIL_TO_PASS"] = "[not json"
    (tmp_path / "bad.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match="not a JSON list"):
        load_tasks(tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match="does not exist"):
        load_tasks(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="unknown dataset format"):
        convert(row, "swe-bench-pro")


def test_r2egym_gold_patch_is_rebuilt_from_parsed_commit_content():
    """R2E-Gym ships the fix as a parsed commit; its non-test file diffs are the gold patch."""
    from envhub.envs.swe.datasets import r2egym_gold_patch
    from envhub.envs.swe.published import parsed_commit

    for inst in BUNDLED:
        assert r2egym_gold_patch(json.dumps(parsed_commit(inst.patch + inst.test_patch))) == inst.patch
    row = published_row(BUNDLED[0], "r2egym")
    assert "patch" not in row and convert(row).patch == BUNDLED[0].patch
