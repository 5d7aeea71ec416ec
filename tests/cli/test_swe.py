"""`envhub swe grade` and `envhub swe validate` on Docker, in-process."""

import dataclasses
import json

from envhub.cli.main import main
from envhub.envs.swe.repos import build_bundled_repos
from envhub.envs.swe.tasks import BUNDLED_TASKS, load_instances, write_instances

BAD_PATCH = "diff --git a/nothing.py b/nothing.py\n--- a/nothing.py\n+++ b/nothing.py\n@@ -1 +1 @@\n-x\n+y\n"


def test_grade_predictions_file(tmp_path, base_image, capsys):
    gold, empty, broken = load_instances(BUNDLED_TASKS)[:3]
    predictions = tmp_path / "preds.jsonl"
    rows = [
        {"instance_id": gold.instance_id, "model_patch": gold.patch, "model_name_or_path": "oracle"},
        {"instance_id": empty.instance_id, "model_patch": "", "model_name_or_path": "oracle"},
        {"instance_id": broken.instance_id, "model_patch": BAD_PATCH, "model_name_or_path": "oracle"},
        {"instance_id": "nobody__nothing-1", "model_patch": "", "model_name_or_path": "oracle"},
    ]
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report.json"
    code = main(["swe", "grade", "--predictions", str(predictions), "--out", str(out), "--workers", "3"])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["resolved_ids"] == [gold.instance_id]
    assert report["unresolved_ids"] == [empty.instance_id]
    assert report["error_ids"] == sorted([broken.instance_id, "nobody__nothing-1"])
    assert "does not apply" in report["details"][broken.instance_id]["error"]
    assert report["details"][empty.instance_id]["tests"][empty.FAIL_TO_PASS[0]] == "FAILED"
    assert "resolved 1/4" in capsys.readouterr().err


def test_validate_reports_one_line_per_problem(tmp_path, base_image, capsys):
    good, *rest = load_instances(BUNDLED_TASKS)[:6]
    broken = [
        dataclasses.replace(rest[0], instance_id="bad-commit", base_commit="0" * 40),
        dataclasses.replace(rest[1], instance_id="no-repo", repo="nobody/nothing"),
        dataclasses.replace(rest[2], instance_id="bad-gold", patch=BAD_PATCH),
        dataclasses.replace(
            rest[3], instance_id="passes-before", FAIL_TO_PASS=rest[3].FAIL_TO_PASS + rest[3].PASS_TO_PASS[:1]
        ),
        dataclasses.replace(rest[4], instance_id="bad-tests", test_patch=BAD_PATCH),
    ]
    tasks = tmp_path / "tasks.jsonl"
    write_instances([good, *broken], tasks)
    code = main(["swe", "validate", "--tasks", str(tasks), "--repos-dir", str(build_bundled_repos()), "--workers", "3"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 1
    by_id = {line.split(":", 1)[0]: line for line in lines}
    assert set(by_id) == {"bad-commit", "no-repo", "bad-gold", "passes-before", "bad-tests"}, lines
    assert "bad base_commit" in by_id["bad-commit"]
    assert "repo missing" in by_id["no-repo"]
    assert "gold patch does not apply" in by_id["bad-gold"]
    assert f"FAIL_TO_PASS test {rest[3].PASS_TO_PASS[0]} passes before the gold patch" in by_id["passes-before"]
    assert "test patch does not apply" in by_id["bad-tests"]
    assert len(lines) == 5
