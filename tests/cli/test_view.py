"""`envhub view`: runs' pages served on 127.0.0.1, read by the real aiohttp client and by headless Chromium."""

import asyncio
import io
import json
import os
import re
import tempfile

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from matplotlib import image

from envhub.cli.main import main
from envhub.cli.view import make_app
from envhub.envs.web import browser
from envhub.trainer.run.metrics import MetricsLogger
from envhub.trainer.run.record import EpisodeRecorder
from envhub.trainer.trajectory import Trajectory
from tests.chromium_devtools import chromium_page

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


EVAL = {  # eval.json as trainer/evaluation.py writes it
    "Sokoban-v0": {"episodes": 4, "before": 0.25, "before_se": 0.25, "after": 0.75, "after_se": 0.25},
    "Math-v0": {"episodes": 4, "before": 0.5, "before_se": 0.29, "after": 1.0, "after_se": 0.0},
    "overall": {"episodes": 8, "before": 0.375, "before_se": 0.18, "after": 0.875, "after_se": 0.13},
}


async def serve(run_dirs):
    """Start `envhub view`'s app on a free loopback port; returns (base URL, runner)."""
    runner = web.AppRunner(make_app(run_dirs))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/", runner


@pytest.fixture
async def served(tmp_path):
    write_run(tmp_path)
    url, runner = await serve(tmp_path)
    yield url
    await runner.cleanup()


@pytest.fixture
async def two_runs(tmp_path):
    """Two runs in directories both named `ci-tiny` (a/ci-tiny has eval.json, b/ci-tiny is still starting)."""
    first, second = tmp_path / "a" / "ci-tiny", tmp_path / "b" / "ci-tiny"
    write_run(first)
    (first / "eval.json").write_text(json.dumps(EVAL))
    EpisodeRecorder(second).close(step=0)
    url, runner = await serve([first, second])
    yield url, second
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
        for bad in ("api/episode/" + "9" * 5000, "api/episode/%C2%B2", "api/summary?run=1", "api/episode/0?run=x"):
            assert (await session.get(served + bad)).status == 404, bad


async def test_several_runs_on_one_page_with_curves_side_by_side_and_eval_tables(two_runs):
    url, second = two_runs
    async with aiohttp.ClientSession() as session:
        runs = await (await session.get(url + "api/runs")).json()
        assert [r["label"] for r in runs] == ["a/ci-tiny", "b/ci-tiny"]  # same names told apart by their parents
        page = await (await session.get(url)).text()
        charts = re.findall(r'<svg class="chart".*?</svg>', page, re.S)
        assert [re.search(r'class="title">([^<]+)<', c).group(1) for c in charts] == ["all", "Math-v0", "Sokoban-v0"]
        assert all(c.count("<polyline") == 1 for c in charts)  # the second run has no step yet
        assert "<td>Math-v0</td><td>0.500 ± 0.290</td><td>1.000 ± 0.000</td><td>+0.500</td>" in page
        assert page.count("no eval.json") == 1 and page.count('<tr class="ep') == 3
        # the second run is written meanwhile: a reload shows its curve and its eval table
        metrics = MetricsLogger(second, tensorboard=False)
        for step in (1, 2):
            metrics.log(step, {"reward": {"all": 0.1 * step, "Sokoban-v0": 0.1 * step, "Math-v0": 0.1}})
        (second / "eval.json").write_text(json.dumps(EVAL))
        page = await (await session.get(url)).text()
        charts = re.findall(r'<svg class="chart".*?</svg>', page, re.S)
        assert [c.count("<polyline") for c in charts] == [2, 2, 2] and "no eval.json" not in page
        summary = await (await session.get(url + "api/summary?run=1")).json()
        assert summary["label"] == "b/ci-tiny" and [r["step"] for r in summary["metrics"]] == [1, 2]
        episode = await (await session.get(url + "api/episode/2?run=0")).json()
        assert episode["task"] == "Math-v0"
        assert (await session.get(url + "api/episode/0?run=1")).status == 404  # the second run has no episode


async def test_fragments_are_the_page_parts_the_script_swaps_in(two_runs):
    url, _ = two_runs
    async with aiohttp.ClientSession() as session:
        listing = await (await session.get(url + "fragment/episodes?task=Math-v0&run=0")).text()
        assert listing.startswith('<section id="episodes">') and listing.count('<tr class="ep') == 1
        detail = await (await session.get(url + "fragment/episode?episode=1&episode_run=0")).text()
        assert detail.startswith('<section id="episode">') and "You pushed a box onto a target." in detail
        page = await (await session.get(url + "?episode=1")).text()
        assert detail in page  # the same HTML, whether fetched by the script or rendered into the page
        missing = await (await session.get(url + "fragment/episode?episode=7&episode_run=1")).text()
        assert "Pick an episode" in missing


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


def require_chromium():
    if browser.find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed but CI requires it: apt-get install -y chromium")
        pytest.skip("Chromium is not installed")


@pytest.mark.slow
async def test_headless_chromium_renders_the_episode_and_the_curves(served, tmp_path):
    require_chromium()
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


@pytest.mark.slow
async def test_first_paint_shows_curves_tables_and_episodes_with_scripts_off(two_runs):
    require_chromium()
    url, _ = two_runs
    async with chromium_page(1200, 800, scripts=False) as page:
        await page.load("data:text/html,<p>static</p><script>document.body.textContent = 'script ran'</script>")
        assert "<p>static</p>" in await page.dom()  # scripts are off indeed
        await page.load(url + "?episode=1")
        dom, shot = await page.dom(), await page.screenshot()
        chart, table = await page.box("svg.chart"), await page.box("table.eval")
    assert dom.count("<polyline") == 3 and "0.500 ± 0.290" in dom and OBSERVATION in dom
    assert dom.count('<tr class="ep') == 3 and "You pushed a box onto a target." in dom
    pixels = image.imread(io.BytesIO(shot), format="png")[..., :3]
    left, top, right, bottom = chart
    assert 0 < top < bottom < 800 and right <= 1200  # the first chart is on the first screen
    blue = np.all(np.abs(pixels[top:bottom, left:right] - [0x3B / 255, 0x7D / 255, 0xD8 / 255]) < 0.08, axis=2)
    assert blue.sum() > 100  # the first run's line is drawn
    left, top, right, bottom = table
    assert 0 < top < bottom < 800 and (pixels[top:bottom, left:right].mean(axis=2) < 0.5).mean() > 0.02  # its text


@pytest.mark.slow
async def test_the_script_swaps_in_an_episode_on_click_and_the_list_on_a_filter(two_runs):
    require_chromium()
    url, _ = two_runs
    wait_for = """new Promise((resolve) => {{
        new MutationObserver(() => {{ if ({done}) resolve(location.search); }})
            .observe(document.body, {{childList: true, subtree: true}});
        {action};
    }})"""
    async with chromium_page(1200, 800) as page:
        await page.load(url)
        clicked = wait_for.format(
            done='document.querySelector("#detail").textContent.includes("seed 13")',
            action='document.querySelector(\'tr.ep[data-href="?episode=2"] td:nth-child(3)\').click()',
        )
        assert await page.evaluate(clicked) == "?episode=2"
        assert "Math-v0" in await page.evaluate('document.querySelector("tr.sel").textContent')
        filtered = wait_for.format(
            done='document.querySelectorAll("tr.ep").length === 2',
            action="""const select = document.querySelector('#filters select[name="task"]');
                select.value = "Sokoban-v0"; select.dispatchEvent(new Event("change", {bubbles: true}))""",
        )
        assert await page.evaluate(filtered) == "?task=Sokoban-v0"


def test_cli_rejects_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["view", str(tmp_path)]) == 2
    assert "no episodes.jsonl" in capsys.readouterr().err
    write_run(tmp_path / "run")
    assert main(["view", str(tmp_path / "run"), str(tmp_path / "missing")]) == 2
    assert "'" + str(tmp_path / "missing") + "' not found" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "run"), str(tmp_path / "run" / ".." / "run")]) == 2
    assert "given twice" in capsys.readouterr().err


async def test_an_envhub_eval_directory_is_viewable_turn_by_turn(tmp_path):
    from envhub.agents import ExpertAgent
    from envhub.eval import evaluate
    from envhub.trainer.run.record import read_episodes

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


async def test_an_eval_directory_shows_its_summary_and_episodes_without_the_training_panels(tmp_path):
    from envhub.agents import ExpertAgent
    from envhub.eval import EvalConfig, evaluate

    def broken():
        raise FileNotFoundError("no such level file: levels/7.txt")

    config = EvalConfig(env_factories={"Broken-v0": broken})
    await evaluate(
        ["FrozenLake-v0", "Broken-v0"], ExpertAgent, episodes=2, concurrency=1, out_dir=tmp_path, config=config
    )
    url, runner = await serve(tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            page = await (await session.get(url)).text()
            turns = await (await session.get(url + "fragment/episode?episode=0")).text()
            failed = await (await session.get(url + "fragment/episode?episode=2")).text()
    finally:
        await runner.cleanup()
    assert "No learner step yet" not in page and "no eval.json" not in page and "learner steps" not in page
    assert "4 episodes, an evaluation" in page and "Evaluation (summary.json)" in page
    cells = lambda env: re.findall(r"<td>(.*?)</td>", re.search(rf"<tr><td>{env}</td>.*?</tr>", page).group(0))
    assert cells("FrozenLake-v0") == ["FrozenLake-v0", "2", "1.000", "1.000 ± 0.000", "—"]
    assert cells("Broken-v0") == ["Broken-v0", "0", "—", "0.000 ± 0.000", "env_error 2"]
    assert "Model, turn 1" in turns and "?" not in re.sub(r"<pre>.*?</pre>", "", turns, flags=re.S)
    assert "seed 0  attempt 0" in turns and "policy versions" not in turns
    assert "error (env_error): FileNotFoundError: no such level file" in failed


async def test_each_model_turn_shows_the_advantage_the_runs_estimator_gives_it(tmp_path):
    """A gigpo run: two episodes of one group reach the goal, one after a wasted move at the start square. The
    page shows each turn's advantage as the learner computes it (GiGPO, gamma 0.5): the wasted move -1.414, the
    moves from the start square that led on +0.707, the arrivals 0 (as worked out in
    tests/trainer/learner/test_credit.py)."""
    from envhub.trainer.trajectory import TurnSpan

    recorder = EpisodeRecorder(tmp_path)
    for anchors in (["s0", "s1"], ["s0", "s0", "s1"]):
        spans, log, ids = [], [{"kind": "reset", "observation": "start"}], [1, 1]
        for n, anchor in enumerate(anchors):
            reward = 1.0 if n == len(anchors) - 1 else 0.0
            spans.append(TurnSpan(len(ids), len(ids) + 1, reward, anchor))
            log.append({"kind": "turn", "text": "go", "anchor": anchor, "span": [len(ids), len(ids) + 1],
                        "reward": reward, "observation": "next"})  # fmt: skip
            ids += [5, 9]
        n = len(ids)
        trajectory = Trajectory(ids, [0, 0] + [1, 0] * len(anchors), [0.0] * n, [0] * n, 1.0, "Corridor-v0", "g0", 1,
                                len(anchors), "terminated", turn_log=log, turn_spans=spans)  # fmt: skip
        recorder.episode(trajectory, step=0)
    recorder.group("g0", "Corridor-v0", "trained", 1)
    recorder.close(step=1)
    (tmp_path / "config.json").write_text(json.dumps({"algorithm": {"advantage": "gigpo", "gamma": 0.5}}))
    url, runner = await serve(tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            short = await (await session.get(url + "fragment/episode?episode=0")).text()
            wasted = await (await session.get(url + "fragment/episode?episode=1")).text()
    finally:
        await runner.cleanup()
    assert re.findall(r"advantage ([-+0-9.]+) \(gigpo\)", short) == ["+0.707", "+0.000"]
    assert re.findall(r"advantage ([-+0-9.]+) \(gigpo\)", wasted) == ["-1.414", "+0.707", "+0.000"]
