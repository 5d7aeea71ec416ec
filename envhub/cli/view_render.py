"""The summary of `envhub view`, rendered on the server: reward curves as inline SVG and eval tables.

Pure functions from run records (metrics.jsonl rows, eval.json) to escaped HTML, so the page's first paint needs no
script. Curves: one small chart per task (plus "all" when there are several tasks), every run a line, the same axes
in every chart. Eval tables: one per run, each label of eval.json (before, sft, after) as mean ± standard error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

COLORS = ("#3b7dd8", "#d8543b", "#2a9d5c", "#9b59b6", "#e0a000", "#555555", "#17a2b8", "#c2185b")
MAX_POINTS = 1000  # points per line; longer runs are thinned evenly (a chart is ~300 pixels wide)
CHART_W, CHART_H, PAD_L, PAD_R, PAD_T, PAD_B = 300, 170, 34, 8, 18, 24


@dataclass(frozen=True)
class RunSummary:
    """What the summary shows of one run: its label, metrics rows and eval.json (None when there is none), or, for
    an `envhub eval --out` directory, its summary.json."""

    label: str
    rows: list[dict[str, Any]]
    evaluation: Any = None
    episodes: int = 0
    eval_summary: Any = None  #: summary.json of an `envhub eval` directory (None for a training run)

    @property
    def is_evaluation(self) -> bool:
        """True for an `envhub eval --out` directory: a summary.json and no learner step."""
        return self.eval_summary is not None and not self.rows


@dataclass(frozen=True)
class Bounds:
    """The shared axes of every chart: learner steps by reward."""

    x0: float
    x1: float
    y0: float
    y1: float

    def point(self, step: float, value: float) -> tuple[float, float]:
        """SVG coordinates of (step, value) inside a chart."""
        width, height = CHART_W - PAD_L - PAD_R, CHART_H - PAD_T - PAD_B
        x = PAD_L + (step - self.x0) / (self.x1 - self.x0) * width
        y = PAD_T + (self.y1 - value) / (self.y1 - self.y0) * height
        return round(x, 1), round(y, 1)


def color(run: int) -> str:
    """The line colour of the run at position `run`."""
    return COLORS[run % len(COLORS)]


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def curve_points(rows: list[dict[str, Any]], task: str) -> list[tuple[float, float]]:
    """(step, mean reward) of `task` ("all" for every task) over the rows that have both as finite numbers."""
    points = []
    for row in rows:
        step, value = _number(row.get("step")), _number(row.get(f"reward/{task}"))
        if step is not None and value is not None:
            points.append((step, value))
    if len(points) > MAX_POINTS:
        stride = math.ceil(len(points) / MAX_POINTS)
        points = points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])
    return points


def chart_tasks(runs: list[RunSummary]) -> list[str]:
    """The charts to draw: every task seen in any run, led by "all" only when there are several (with one task,
    "all" is the same line and would hide it)."""
    keys = {k.removeprefix("reward/") for run in runs for row in run.rows for k in row if k.startswith("reward/")}
    tasks = sorted(keys - {"all"})
    if len(tasks) == 1:
        return tasks
    return (["all"] if "all" in keys else []) + tasks


def shared_bounds(runs: list[RunSummary], tasks: list[str]) -> Bounds:
    """Axes covering every point of every chart: steps as seen, rewards at least [0, 1]."""
    points = [p for run in runs for task in tasks for p in curve_points(run.rows, task)]
    steps = [s for s, _ in points] or [0.0]
    values = [v for _, v in points]
    x0, x1 = min(steps), max(steps)
    return Bounds(x0, x1 if x1 > x0 else x0 + 1, min([0.0, *values]), max([1.0, *values]))


def _tick(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.2f}"


def _axes_svg(bounds: Bounds) -> list[str]:
    """Frame, grid lines and tick labels of one chart."""
    parts = []
    for value in (bounds.y0, (bounds.y0 + bounds.y1) / 2, bounds.y1):
        _, y = bounds.point(bounds.x0, value)
        parts.append(f'<line x1="{PAD_L}" y1="{y}" x2="{CHART_W - PAD_R}" y2="{y}" stroke="#e4e6ea"/>')
        parts.append(f'<text x="{PAD_L - 4}" y="{y + 3}" text-anchor="end">{_tick(value)}</text>')
    bottom = CHART_H - PAD_B
    parts.append(f'<line x1="{PAD_L}" y1="{bottom}" x2="{CHART_W - PAD_R}" y2="{bottom}" stroke="#888"/>')
    parts.append(f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{bottom}" stroke="#888"/>')
    for step, anchor in ((bounds.x0, "start"), (bounds.x1, "end")):
        x, _ = bounds.point(step, bounds.y0)
        parts.append(f'<text x="{x}" y="{bottom + 12}" text-anchor="{anchor}">{_tick(step)}</text>')
    parts.append(f'<text x="{(PAD_L + CHART_W) / 2}" y="{CHART_H - 2}" text-anchor="middle">learner step</text>')
    return parts


def _line_svg(label: str, stroke: str, points: list[tuple[float, float]], bounds: Bounds) -> str:
    """One run's curve: a polyline (and a dot when there is a single point, which a polyline does not show)."""
    xy = [bounds.point(s, v) for s, v in points]
    title = f"<title>{escape(label)}</title>"
    line = (
        f'<polyline points="{" ".join(f"{x},{y}" for x, y in xy)}" fill="none" stroke="{stroke}" '
        f'stroke-width="2">{title}</polyline>'
    )
    dot = f'<circle cx="{xy[0][0]}" cy="{xy[0][1]}" r="3" fill="{stroke}">{title}</circle>' if len(xy) == 1 else ""
    return line + dot


def chart_svg(task: str, runs: list[RunSummary], bounds: Bounds) -> str:
    """The chart of one task: every run that has points for it as one line."""
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {CHART_W} {CHART_H}" '
        f'width="{CHART_W}" height="{CHART_H}" role="img" aria-label="mean reward of {escape(task)}">',
        f'<text x="{PAD_L}" y="12" class="title">{escape(task)}</text>',
        *_axes_svg(bounds),
    ]
    for n, run in enumerate(runs):
        points = curve_points(run.rows, task)
        if points:
            parts.append(_line_svg(run.label, color(n), points, bounds))
    parts.append("</svg>")
    return "".join(parts)


def legend_html(labels: list[str]) -> str:
    """A colour swatch and the label of each run."""
    items = "".join(
        f'<span><i style="background:{color(n)}"></i>{escape(label)}</span>' for n, label in enumerate(labels)
    )
    return f'<div class="legend">{items}</div>'


def curves_html(runs: list[RunSummary]) -> str:
    """The curves section: one chart per task side by side on shared axes, and the runs' legend."""
    tasks = chart_tasks(runs)
    if not tasks:
        return '<section id="curves"><h2>Mean reward per task</h2><p class="meta">No learner step yet.</p></section>'
    bounds = shared_bounds(runs, tasks)
    charts = "".join(chart_svg(task, runs, bounds) for task in tasks)
    return (
        f'<section id="curves"><h2>Mean reward per task</h2><div class="charts">{charts}</div>'
        f"{legend_html([run.label for run in runs])}</section>"
    )


def eval_labels(report: dict[str, Any]) -> list[str]:
    """The evaluation labels of an eval.json report (before, sft, after, ...) in the order they were measured."""
    labels: list[str] = []
    for row in report.values():
        if isinstance(row, dict):
            labels += [k for k in row if k != "episodes" and not k.endswith("_se") and k not in labels]
    return labels


def _mean_se(row: dict[str, Any], label: str) -> str:
    mean, se = _number(row.get(label)), _number(row.get(f"{label}_se"))
    if mean is None:
        return "—"
    return f"{mean:.3f} ± {se:.3f}" if se is not None else f"{mean:.3f}"


def _change(row: dict[str, Any]) -> str:
    before, after = _number(row.get("before")), _number(row.get("after"))
    return "—" if before is None or after is None else f"{after - before:+.3f}"


def eval_table_html(label: str, report: Any) -> str:
    """One run's eval.json as a table: a row per task and overall, a column per label, the change after - before."""
    caption = f"<caption>{escape(label)}</caption>"
    note = lambda text: f'<table class="eval">{caption}<tr><td class="meta">{escape(text)}</td></tr></table>'
    if report is None:
        return note("no eval.json (a config's evaluation: stage writes it)")
    if isinstance(report, dict) and isinstance(report.get("error"), str):  # the server could not read it
        return note(report["error"])
    if not isinstance(report, dict) or not all(isinstance(row, dict) for row in report.values()):
        return note("eval.json is not a report by task")
    labels = eval_labels(report)
    change = "before" in labels and "after" in labels
    head = "".join(f"<th>{escape(x)}</th>" for x in ["task", *labels, *(["after - before"] * change), "episodes"])
    body = []
    for task, row in report.items():
        cells = [escape(str(task)), *(_mean_se(row, x) for x in labels), *([_change(row)] * change)]
        cells.append(escape(str(row.get("episodes", ""))))
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f'<table class="eval">{caption}<tr>{head}</tr>{"".join(body)}</table>'


def evals_html(runs: list[RunSummary]) -> str:
    """The evaluation section: one table per run."""
    tables = "".join(eval_table_html(run.label, run.evaluation) for run in runs)
    return f'<section id="evals"><h2>Held-out evaluation (eval.json)</h2><div class="tables">{tables}</div></section>'


def _pass_cells(row: dict[str, Any], ks: list[str]) -> list[str]:
    values = row.get("pass_at_k") if isinstance(row.get("pass_at_k"), dict) else {}
    return [f"{v:.3f}" if (v := _number(values.get(k))) is not None else "—" for k in ks]


def eval_summary_html(label: str, summary: Any) -> str:
    """An `envhub eval` directory's summary.json as a table: a row per env (per seat for games) with its scored
    episodes, success (pass@k), mean reward ± standard error, progress where the env reports it, and errors."""
    caption = f"<caption>{escape(label)}</caption>"
    if isinstance(summary, dict) and isinstance(summary.get("error"), str):  # the server could not read it
        return f'<table class="eval">{caption}<tr><td class="meta">{escape(summary["error"])}</td></tr></table>'
    if not isinstance(summary, dict) or not all(isinstance(row, dict) for row in summary.values()):
        return (
            f'<table class="eval">{caption}<tr><td class="meta">summary.json is not a summary by env</td></tr></table>'
        )
    ks = sorted({str(k) for row in summary.values() for k in row.get("pass_at_k") or {}}, key=int)
    with_progress = any(isinstance(row.get("progress"), dict) for row in summary.values())
    head = ["env", "episodes", *(f"success (pass@{k})" for k in ks), "mean reward", *(["progress"] * with_progress)]
    body = []
    for env_id, row in summary.items():
        progress = row.get("progress") if isinstance(row.get("progress"), dict) else {}
        errors = row.get("errors") if isinstance(row.get("errors"), dict) else {}
        cells = [escape(str(env_id)), escape(str(row.get("episodes", ""))), *_pass_cells(row, ks)]
        cells.append(_mean_se({"m": row.get("mean_reward"), "m_se": row.get("stderr")}, "m"))
        cells += [_mean_se({"m": progress.get("mean"), "m_se": progress.get("stderr")}, "m")] * with_progress
        cells.append(escape(", ".join(f"{kind} {n}" for kind, n in errors.items()) or "—"))
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{escape(x)}</th>" for x in [*head, "errors"])
    return f'<table class="eval">{caption}<tr>{header}</tr>{"".join(body)}</table>'


def eval_summaries_html(runs: list[RunSummary]) -> str:
    """The section of the `envhub eval` directories: one summary table each."""
    tables = "".join(eval_summary_html(run.label, run.eval_summary) for run in runs)
    return f'<section id="evals"><h2>Evaluation (summary.json)</h2><div class="tables">{tables}</div></section>'


def header_html(runs: list[RunSummary]) -> str:
    """The page's header: each run's label with its counts of episodes and learner steps (evaluations: episodes)."""
    items = "".join(
        f'<span><i style="background:{color(n)}"></i>{escape(run.label)}: {run.episodes} episodes, '
        + ("an evaluation" if run.is_evaluation else f"{len(run.rows)} learner steps")
        + "</span>"
        for n, run in enumerate(runs)
    )
    return f'<header><h1>envhub view</h1><div id="runs">{items}</div></header>'


def page_html(template: str, runs: list[RunSummary], episodes: str, detail: str) -> str:
    """The whole page in the template's slots: header, curves and eval tables of training runs, summaries of
    evaluations, then the episode list and detail. A page of evaluations only has no training panels."""
    training = any(not run.is_evaluation for run in runs)
    evaluations = [run for run in runs if run.is_evaluation]
    panels = f"{curves_html(runs)}{evals_html(runs)}" if training else ""
    summary = f'<div class="summary">{panels}{eval_summaries_html(evaluations) if evaluations else ""}</div>'
    body = f"{header_html(runs)}{summary}<main>{episodes}{detail}</main>"
    title = escape(", ".join(run.label for run in runs))
    return template.replace("<!--envhub:title-->", title).replace("<!--envhub:body-->", body)
