"""`envhub eval ENV --agent MODEL --harness HARNESS`: a command-line harness in real sandboxes, the tiny model served
through the real gateway; episodes.jsonl lists each episode's model calls and whether they merged."""

from __future__ import annotations

import json

import pytest

from envhub.cli.main import main
from tests.trainer.harness.scripts import SOLVER, command

pytest.importorskip("torch")

#: asks the model once, then answers Letters-v0 with a text of allowed letters
LETTERS = SOLVER.split("\nimport re")[0] + "\nask(os.environ['ENVHUB_TASK'])\nprint('aeiou')\n"


def test_eval_runs_a_command_line_harness_and_records_its_calls(tmp_path, base_rootfs, capsys):
    out = tmp_path / "out"
    argv = ["eval", "Letters-v0", "--agent", "tiny", "--harness", command(LETTERS), "-n", "2", "--out", str(out)]
    assert main([*argv, "--max-tokens", "4", "--concurrency", "2"]) == 0
    assert "Letters-v0: 2 episodes" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["seed"] for r in records) == [0, 1]
    for record in records:
        assert record["error"] is None and record["action"] == "aeiou" and record["merged"]
        [call] = record["calls"]
        assert 1 <= len(call["output_ids"]) <= 4 and len(call["logprobs"]) == len(call["output_ids"])
        assert call["prompt_ids"] and call["versions"] == [0] * len(call["output_ids"])
    summary = json.loads((out / "summary.json").read_text())["envs"]["Letters-v0"]
    assert summary["episodes"] == 2 and summary["errors"] == 0 and summary["merged_share"] == 1.0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--agent", "random"], "cannot serve a harness"),
        (["--agent", "openai:http://127.0.0.1:1/v1"], "cannot serve a harness"),
        (["--agent", "vllm:http://127.0.0.1:1"], "is not vllm:URL#MODEL"),  # no model for the tokenizer
        (["--agent", "vllm:127.0.0.1:1#tiny"], "is not vllm:URL#MODEL"),
        (["--agent", "vllm:http://127.0.0.1:1#gpt-4"], "cannot serve a harness"),
        (["--agent", "tiny", "--kwargs", "{nope"], "--kwargs is not JSON"),
        (["--agent", "tiny", "--harness", " "], "harness is empty"),
    ],
)
def test_eval_refuses_what_a_harness_cannot_use(extra, message, capsys):
    assert main(["eval", "Letters-v0", "--harness", "true", *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_vllm_agent_spec_names_the_server_and_the_tokenizers_model():
    from envhub.cli.harness_eval import model_name

    assert model_name("vllm:http://127.0.0.1:8000#smollm2") == "smollm2"
    assert model_name("vllm:https://engine.internal:443/#hf:/models/qwen") == "/models/qwen"
