"""`envhub view`'s server-side rendering: curves, eval tables, the episode list and one episode, as pure functions."""

import math
import re

from envhub.cli.view_episodes import (
    PAGE_SIZE,
    ListQuery,
    episode_detail_html,
    episode_list_html,
    parse_index,
)
from envhub.cli.view_render import (
    MAX_POINTS,
    RunSummary,
    chart_svg,
    chart_tasks,
    curve_points,
    curves_html,
    eval_table_html,
    page_html,
    shared_bounds,
)

HOSTILE = '<script>alert("x")</script>'


def rows(task_values):
    """Metrics rows as MetricsLogger writes them: reward/all plus reward/<task> per step."""
    out = []
    for step, values in enumerate(task_values, start=1):
        row = {"step": step, "reward/all": sum(values.values()) / len(values)}
        out.append(row | {f"reward/{task}": v for task, v in values.items()})
    return out


def test_one_task_gets_its_own_chart_and_several_tasks_add_all():
    single = [RunSummary("a", rows([{"Letters-v0": 0.3}, {"Letters-v0": 0.5}]))]
    assert chart_tasks(single) == ["Letters-v0"]  # "all" would be the same line drawn over it
    html = curves_html(single)
    assert html.count("<svg") == 1 and ">Letters-v0</text>" in html and html.count("<polyline") == 1
    two = [RunSummary("a", rows([{"Math-v0": 0.1, "Sokoban-v0": 0.9}]))]
    assert chart_tasks(two) == ["all", "Math-v0", "Sokoban-v0"]
    assert chart_tasks([RunSummary("a", [])]) == [] and "No learner step yet" in curves_html([RunSummary("a", [])])


def test_every_run_is_a_line_in_each_chart_on_shared_axes():
    a = RunSummary("run-a", rows([{"T": 0.2}, {"T": 0.4}, {"T": 0.6}]))
    b = RunSummary("run-b", rows([{"T": -0.5}, {"T": 0.1}]) + [{"step": 9, "reward/T": 1.5}])
    bounds = shared_bounds([a, b], ["T"])
    assert (bounds.x0, bounds.x1, bounds.y0, bounds.y1) == (1, 9, -0.5, 1.5)
    svg = chart_svg("T", [a, b], bounds)
    lines = re.findall(r'<polyline points="([^"]+)" fill="none" stroke="(#\w+)"', svg)
    assert [color for _, color in lines] == ["#3b7dd8", "#d8543b"] and "<title>run-b</title>" in svg
    b_points = [tuple(map(float, p.split(","))) for p in lines[1][0].split()]
    assert b_points[0][1] == bounds.point(1, -0.5)[1] == 146.0  # the lowest value sits on the x axis
    assert b_points[-1] == bounds.point(9, 1.5) == (292.0, 18.0)  # the last step at the right, the top value on top


def test_curve_points_skip_missing_and_non_numbers_and_thin_long_runs():
    raw = [{"step": 1, "reward/T": None}, {"step": 2, "reward/T": math.nan}, {"step": 3, "reward/T": True}]
    raw += [{"step": 4, "reward/T": 0.5}, {"step": "5", "reward/T": 0.5}, {"reward/T": 0.5}]
    assert curve_points(raw, "T") == [(4, 0.5)]
    long = [{"step": s, "reward/T": s / 5000} for s in range(5001)]
    points = curve_points(long, "T")
    assert len(points) <= MAX_POINTS + 1 and points[0] == (0, 0) and points[-1] == (5000, 1.0)
    one = chart_svg("T", [RunSummary("a", long[:1])], shared_bounds([RunSummary("a", long[:1])], ["T"]))
    assert "<circle" in one  # a single point shows as a dot


def test_eval_table_shows_each_label_with_its_standard_error_and_the_change():
    report = {
        "Letters-v0": {"episodes": 8, "before": 0.375, "before_se": 0.02, "sft": 0.5, "sft_se": 0.0, "after": 0.75},
        "overall": {"episodes": 8, "before": 0.375, "before_se": 0.02, "sft": 0.5, "sft_se": 0.0, "after": 0.75},
    }
    html = eval_table_html("ci-tiny", report)
    headers = re.findall(r"<th>([^<]*)</th>", html)
    assert headers == ["task", "before", "sft", "after", "after - before", "episodes"]
    cells = re.findall(r"<td>([^<]*)</td>", html)[:6]
    assert cells == ["Letters-v0", "0.375 ± 0.020", "0.500 ± 0.000", "0.750", "+0.375", "8"]
    assert "no eval.json" in eval_table_html("a", None)
    assert "not a report" in eval_table_html("a", [1, 2]) and "not a report" in eval_table_html("a", {"t": 3})
    broken = eval_table_html(HOSTILE, {"error": "eval.json: Expecting value"})
    assert "Expecting value" in broken and HOSTILE not in broken and "&lt;script&gt;" in broken


def episode(i, run=0, task="Letters-v0", step=0, outcome="trained"):
    return {
        "run": run,
        "i": i,
        "task": task,
        "step": step,
        "seed": i,
        "reward": 0.5,
        "turns": 1,
        "group_outcome": outcome,
    }


def test_episode_list_pages_and_filters_with_links_that_work_without_scripts():
    index = [episode(i, step=i // 50) for i in range(250)] + [episode(0, run=1, task="Math-v0", outcome=None)]
    html = episode_list_html(index, ["a", "b"], ListQuery())
    assert html.count('<tr class="ep') == PAGE_SIZE and "episodes 1-100 of 251" in html
    assert 'href="?page=1">next' in html and "previous" not in html and "<th>run</th>" in html
    last = episode_list_html(index, ["a", "b"], ListQuery(page=2))
    assert last.count('<tr class="ep') == 51 and 'href="?page=1">« previous' in last and "next" not in last
    math_only = episode_list_html(index, ["a", "b"], ListQuery(task="Math-v0"))
    assert math_only.count('<tr class="ep') == 1 and "pending" in math_only
    assert 'href="?task=Math-v0&amp;episode=0&amp;episode_run=1"' in math_only  # the filter stays on the link
    step = episode_list_html(index, ["a", "b"], ListQuery(step="4", run=0))
    assert step.count('<tr class="ep') == 50 and '<option value="4" selected>' in step
    assert episode_list_html(index, ["a", "b"], ListQuery(page=9)).count('<tr class="ep') == 0


def test_query_parameters_from_the_network_fall_back_to_defaults():
    assert ListQuery.parse({"run": "1", "episode": "7", "episode_run": "1", "page": "2"}, runs=2) == ListQuery(
        run=1, page=2, episode=(1, 7)
    )
    assert ListQuery.parse({"run": "2", "episode": "0", "episode_run": "2"}, runs=2) == ListQuery()  # 2 runs: 0, 1
    for bad in ("-1", "²", "1e3", "9" * 5000, " 1", ""):
        query = ListQuery.parse({"run": bad, "page": bad, "episode": bad, "episode_run": bad}, runs=2)
        assert query.run is None and query.episode is None and query.page == 0, bad
        assert parse_index(bad, 2) is None
    long = ListQuery.parse({"task": "x" * 10_000}, runs=1)
    assert len(long.task) == 200
    assert ListQuery(task="a&b=c", episode=(0, 3)).href() == "?task=a%26b%3Dc&episode=3"


def test_episode_detail_escapes_the_model_and_the_env():
    record = {
        "task": "Letters-v0",
        "seed": 1,
        "group_id": "g",
        "group_outcome": "trained",
        "step": 2,
        "policy_versions": [1, 2],
        "reward": 0.5,
        "log": [
            {"kind": "reset", "observation": HOSTILE},
            {"kind": "turn", "text": HOSTILE, "tool_calls": [{"name": "move", "arguments": {"to": "<up>"}}]},
            {"kind": "turn", "text": "x", "observation": "ok", "reward": 1.0, "tool_call_errors": ["bad json"]},
            "not a turn",
        ],
    }
    html = episode_detail_html(record, "run-a")
    assert "<script>" not in html and html.count("&lt;script&gt;") == 2
    assert 'move({&quot;to&quot;:&quot;&lt;up&gt;&quot;})' in html and "tool call error: bad json" in html
    assert "policy versions 1,2" in html and "Env: reward 1.0" in html and html.count('class="turn') == 4
    assert "Pick an episode" in episode_detail_html(None)


def test_page_fills_the_template_and_escapes_labels():
    runs = [RunSummary(HOSTILE, rows([{"T": 0.5}]), None, 3)]
    html = page_html("<title><!--envhub:title--></title><body><!--envhub:body--></body>", runs, "<ul/>", "<ol/>")
    assert "<script>" not in html and "3 episodes, 1 learner steps" in html
    assert html.index('id="curves"') < html.index('id="evals"') < html.index("<ul/>") < html.index("<ol/>")


def test_an_eval_summary_that_cannot_be_read_says_so_and_hostile_ids_are_escaped():
    from envhub.cli.view_render import eval_summary_html

    assert "summary.json: Expecting value" in eval_summary_html("r", {"error": "summary.json: Expecting value"})
    assert "not a summary by env" in eval_summary_html("r", ["not", "a", "dict"])
    row = {"episodes": 1, "mean_reward": 1, "stderr": 0, "pass_at_k": {"1": None}, "errors": {HOSTILE: 1}}
    html = eval_summary_html(HOSTILE, {HOSTILE: row})
    assert "<script>" not in html and html.count("&lt;script&gt;") == 3 and "<td>—</td>" in html
