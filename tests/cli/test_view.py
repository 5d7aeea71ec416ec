"""`envhub view`: the run's page served on 127.0.0.1, read by the real aiohttp client and by headless Chromium."""

import asyncio
import os
import tempfile

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from matplotlib import image

from envhub.cli.main import main
from envhub.cli.view import make_app
from envhub.envs.web import browser
from envhub.trainer.metrics import MetricsLogger
from envhub.trainer.records import EpisodeRecorder
from envhub.trainer.trajectory import Trajectory

OBSERVATION = "The warehouse has 3 boxes and a locked door"


def write_run(run_dir):
    """A run record written by the trainer's own recorder and metrics logger."""
    recorder = EpisodeRecorder(run_dir)
    for i, (task, reward) in enumerate([("Sokoban-v0", 0.0), ("Sokoban-v0", 1.0), ("Math-v0", 1.0)]):
        recorder.episode(
            Trajectory(
                input_ids=[1, 2],
                loss_mask=[0, 1],
                behavior_logprobs=[0.0, -0.3],
                versions=[-1, 0],
                reward=reward,
                task=task,
                group_id=f"g{i // 2}",
                seed=11 + i,
                turns=1,
                finish_reason="terminated",
                turn_log=[
                    {"kind": "reset", "observation": OBSERVATION, "env_s": 0.01},
                    {
                        "kind": "turn",
                        "text": 'I push <tool_call>{"name": "move", "arguments": {"direction": "up"}}</tool_call>',
                        "generate_s": 0.4,
                        "new_tokens": 9,
                        "engine_finish": "stop",
                        "env_s": 0.02,
                        "observation": "You pushed a box onto a target.",
                        "reward": reward,
                    },
                ],
            ),
            step=i // 2,
        )
    recorder.group("g0", "Sokoban-v0", "trained", 1)
    recorder.close(step=1)
    metrics = MetricsLogger(run_dir, tensorboard=False)
    for step, value in [(1, 0.2), (2, 0.5), (3, 0.7)]:
        metrics.log(step, {"reward": {"all": value, "Sokoban-v0": value - 0.1, "Math-v0": value + 0.1}})


@pytest.fixture
async def served(tmp_path):
    write_run(tmp_path)
    runner = web.AppRunner(make_app(tmp_path))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/"
    await runner.cleanup()


async def test_api_lists_episodes_with_group_outcomes_and_serves_each_turn_by_turn(served):
    async with aiohttp.ClientSession() as session:
        summary = await (await session.get(served + "api/summary")).json()
        assert [e["group_outcome"] for e in summary["episodes"]] == ["trained", "trained", "unfinished"]
        assert [r["step"] for r in summary["metrics"]] == [1, 2, 3]
        episode = await (await session.get(served + "api/episode/1")).json()
        assert episode["log"][0]["observation"] == OBSERVATION
        assert episode["log"][1]["tool_calls"] == [{"name": "move", "arguments": {"direction": "up"}}]
        for bad in ("api/episode/99", "api/episode/-1", "api/episode/abc"):
            response = await session.get(served + bad)
            assert response.status == 404 and "no episode" in (await response.json())["error"]
        page = await (await session.get(served)).text()
        assert "http" not in page.replace("http://www.w3.org/2000/svg", "")  # no external assets


async def _chromium(*args):
    path = browser.find_chromium()
    with tempfile.TemporaryDirectory() as profile:
        process = await asyncio.create_subprocess_exec(
            path,
            *browser._FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(process.communicate(), timeout=90)
    return out.decode()


@pytest.mark.slow
async def test_headless_chromium_renders_the_episode_and_the_curves(served, tmp_path):
    if browser.find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed but CI requires it: apt-get install -y chromium")
        pytest.skip("Chromium is not installed")
    dom = await _chromium("--dump-dom", served + "?episode=1")
    assert OBSERVATION in dom and "You pushed a box onto a target." in dom and 'move({"direction":"up"})' in dom
    assert dom.count("<polyline") == 3 and "Sokoban-v0" in dom  # one curve per reward key (all + 2 tasks)
    shot = tmp_path / "view.png"
    await _chromium(f"--screenshot={shot}", "--window-size=1200,800", served + "?episode=1")
    pixels = image.imread(shot)[..., :3]
    assert pixels.shape == (800, 1200, 3) and pixels.std() > 0.05  # not blank
    episode_pane = pixels[60:, 470:]
    assert (episode_pane.mean(axis=2) < 0.5).mean() > 0.005  # the episode's text is drawn on the right
    assert np.allclose(pixels[5, 600], [0x23 / 255, 0x2F / 255, 0x3E / 255], atol=0.03)  # header bar


def test_cli_rejects_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["view", str(tmp_path)]) == 2
    assert "no episodes.jsonl" in capsys.readouterr().err


async def test_an_envhub_eval_directory_is_viewable_turn_by_turn(tmp_path):
    from envhub.agents import ExpertAgent
    from envhub.eval import evaluate
    from envhub.trainer.records import read_episodes

    await evaluate(["FrozenLake-v0"], ExpertAgent, episodes=2, out_dir=tmp_path, agent_name="expert")
    episodes = read_episodes(tmp_path)
    assert [(e["task"], e["seed"], e["group_outcome"]) for e in episodes] == [
        ("FrozenLake-v0", 0, "evaluated"),
        ("FrozenLake-v0", 1, "evaluated"),
    ]
    first = episodes[0]
    assert first["reward"] == 1.0 and first["log"][0]["kind"] == "reset" and "goal" in first["log"][0]["observation"]
    moves = first["log"][1:]
    assert len(moves) == first["turns"] > 0 and all(t["text"] in ("up", "down", "left", "right") for t in moves)
