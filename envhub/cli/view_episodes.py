"""The episodes of `envhub view`, rendered on the server: a filtered, paged list and one episode turn by turn.

Every filter, page and selected episode is a query parameter (`?task=&step=&outcome=&run=&page=&episode=&episode_run=`),
so plain links and a GET form work without scripts; the page's script fetches the same HTML as fragments.
Parameters come from the network: anything malformed falls back to its default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from html import escape
from typing import Any
from urllib.parse import urlencode

PAGE_SIZE = 100
MAX_PARAM = 200  # characters of a filter value kept (longer ones match nothing anyway)


def parse_index(raw: str | None, limit: int) -> int | None:
    """`raw` as an index below `limit`, or None (only ASCII digits, at most 9 of them: no huge or odd numbers)."""
    if raw is None or not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        return None
    value = int(raw)
    return value if value < limit else None


@dataclass(frozen=True)
class ListQuery:
    """What the episode list shows: filters, the page, and the selected episode (run position, index in its run)."""

    run: int | None = None
    task: str = ""
    step: str = ""
    outcome: str = ""
    page: int = 0
    episode: tuple[int, int] | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str], runs: int) -> ListQuery:
        """The query of a request's parameters over `runs` runs; malformed values are left out."""
        text = {k: str(params.get(k, ""))[:MAX_PARAM] for k in ("task", "step", "outcome")}
        episode = parse_index(params.get("episode"), 10**9)
        episode_run = parse_index(params.get("episode_run", "0"), runs)
        return cls(
            run=parse_index(params.get("run"), runs),
            page=parse_index(params.get("page"), 10**6) or 0,
            episode=None if episode is None or episode_run is None else (episode_run, episode),
            **text,
        )

    def href(self, **changes: Any) -> str:
        """A link to this query with `changes` applied (defaults left out of the URL)."""
        query = replace(self, **changes)
        params = {"task": query.task, "step": query.step, "outcome": query.outcome, "page": query.page or ""}
        params["run"] = "" if query.run is None else query.run
        if query.episode is not None:
            params |= {"episode": query.episode[1], "episode_run": query.episode[0] or ""}
        return "?" + urlencode({k: v for k, v in params.items() if v != ""})

    def matches(self, row: dict[str, Any]) -> bool:
        """Whether an index row passes the filters."""
        return (
            (self.run is None or row["run"] == self.run)
            and (not self.task or str(row.get("task")) == self.task)
            and (not self.step or str(row.get("step")) == self.step)
            and (not self.outcome or outcome_of(row) == self.outcome)
        )


def outcome_of(row: dict[str, Any]) -> str:
    """What became of an episode's group ("pending" while undecided)."""
    return str(row.get("group_outcome") or "pending")


def _select(name: str, label: str, values: list[tuple[str, str]], chosen: str) -> str:
    options = ['<option value="">all</option>'] + [
        f'<option value="{escape(v)}"{" selected" if v == chosen else ""}>{escape(text)}</option>' for v, text in values
    ]
    return f'<label>{label} <select name="{name}">{"".join(options)}</select></label> '


def filters_html(rows: list[dict[str, Any]], labels: list[str], query: ListQuery) -> str:
    """The filter form: a GET form (works without scripts), one select per field."""
    tasks = sorted({str(r.get("task")) for r in rows})
    steps = sorted({str(r.get("step")) for r in rows}, key=lambda s: (len(s), s))  # numbers in order
    outcomes = sorted({outcome_of(r) for r in rows})
    parts = []
    if len(labels) > 1:
        run = "" if query.run is None else str(query.run)
        parts.append(_select("run", "run", [(str(n), label) for n, label in enumerate(labels)], run))
    parts.append(_select("task", "task", [(t, t) for t in tasks], query.task))
    parts.append(_select("step", "step", [(s, s) for s in steps], query.step))
    parts.append(_select("outcome", "outcome", [(o, o) for o in outcomes], query.outcome))
    return f'<form id="filters" class="filters" method="get">{"".join(parts)}<button>filter</button></form>'


def _row_html(row: dict[str, Any], labels: list[str], query: ListQuery) -> str:
    link = query.href(episode=(row["run"], row["i"]))
    selected = query.episode == (row["run"], row["i"])
    reward = row.get("reward")
    cells = [f'<a href="{escape(link)}">{row["i"]}</a>']
    if len(labels) > 1:
        cells.append(escape(labels[row["run"]]))
    cells += [escape(str(row.get(k))) for k in ("task", "step", "seed")]
    cells.append(f"{reward:.2f}" if isinstance(reward, (int, float)) else escape(str(reward)))
    cells.append(escape(str(row.get("turns"))))
    outcome = outcome_of(row)
    cells.append(f'<span class="outcome-{escape(outcome)}">{escape(outcome)}</span>')
    attrs = f'class="ep{" sel" if selected else ""}" data-href="{escape(link)}"'
    return f"<tr {attrs}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _pager_html(total: int, query: ListQuery) -> str:
    first, last = query.page * PAGE_SIZE, min((query.page + 1) * PAGE_SIZE, total)
    links = []
    if query.page > 0:
        links.append(f'<a class="page" href="{escape(query.href(page=query.page - 1))}">« previous</a>')
    if last < total:
        links.append(f'<a class="page" href="{escape(query.href(page=query.page + 1))}">next »</a>')
    shown = f"episodes {first + 1}-{last} of {total}" if total > first else f"no episode here ({total} in all)"
    return f'<div class="pager meta">{shown} {" ".join(links)}</div>'


def episode_list_html(rows: list[dict[str, Any]], labels: list[str], query: ListQuery) -> str:
    """The episodes section: filters, the query's page of matching episodes, and links to the other pages."""
    matching = [r for r in rows if query.matches(r)]
    page = matching[query.page * PAGE_SIZE : (query.page + 1) * PAGE_SIZE]
    head = ["#", *(["run"] if len(labels) > 1 else []), "task", "step", "seed", "reward", "turns", "group"]
    table = (
        "<table><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(_row_html(r, labels, query) for r in page)
        + "</tbody></table>"
    )
    return (
        f'<section id="episodes"><h2>Episodes</h2>{filters_html(rows, labels, query)}'
        f'<div id="list">{table}</div>{_pager_html(len(matching), query)}</section>'
    )


def _turn_html(n: int, turn: dict[str, Any], advantage: str = "") -> str:
    """One log entry: the reset observation, or a model turn (with its advantage) and what the env answered."""
    if turn.get("kind") == "reset":
        observation = escape(str(turn.get("observation", "")))
        return f'<div class="turn env"><b>Observation (reset)</b><pre>{observation}</pre></div>'
    # an engine's turn says how long it took; an `envhub eval` agent's turn does not (no "? tokens in ?s")
    timing = (
        f"  {turn['new_tokens']} tokens in {turn.get('generate_s', '?')}s ({turn.get('engine_finish', '?')})"
        if "new_tokens" in turn
        else ""
    )
    parts = [f'<div class="turn model"><b>Model, turn {n}</b><span class="meta">{escape(timing)}</span>']
    if advantage:
        parts.append(f'<span class="advantage">  {escape(advantage)}</span>')
    parts.append(f"<pre>{escape(str(turn.get('text') or ''))}</pre>")
    for call in turn.get("tool_calls") or []:
        if isinstance(call, dict):
            arguments = json.dumps(call.get("arguments"), separators=(",", ":"), ensure_ascii=False)
            parts.append(f'<div class="tool">{escape(str(call.get("name")))}({escape(arguments)})</div>')
    for error in turn.get("tool_call_errors") or []:
        parts.append(f'<div class="meta">tool call error: {escape(str(error))}</div>')
    parts.append("</div>")
    if "observation" in turn:
        env_time = f"  {turn['env_s']}s" if "env_s" in turn else ""
        parts.append(
            f'<div class="turn env"><b>Env: reward {escape(str(turn.get("reward")))}</b>'
            f'<span class="meta">{escape(env_time)}</span>'
            f"<pre>{escape(str(turn['observation']))}</pre></div>"
        )
    return "".join(parts)


def episode_detail_html(
    episode: dict[str, Any] | None, label: str = "", estimator: str = "", advantages: list[float] | None = None
) -> str:
    """The episode section: one episode turn by turn, each model turn with the advantage `estimator` gives it
    (None: a hint to pick one)."""
    if episode is None:
        return '<section id="episode"><h2>Episode</h2><div id="detail" class="meta">Pick an episode.</div></section>'
    get = lambda k: escape(str(episode.get(k)))
    versions = ",".join(str(v) for v in episode.get("policy_versions") or [])
    if outcome_of(episode) == "evaluated":  # an `envhub eval` episode: no learner step, policy or token counts
        meta = [
            f"{escape(label)} {get('task')}  seed {get('seed')}  attempt {get('step')}",
            f"reward {get('reward')}  finish {get('finish_reason')}  turns {get('turns')}  {get('duration_s')}s",
        ]
    else:
        meta = [
            f"{escape(label)} {get('task')}  seed {get('seed')}  group {get('group_id')} "
            f"({escape(outcome_of(episode))})  step {get('step')}  policy versions {escape(versions)}",
            f"reward {get('reward')}  finish {get('finish_reason')}  turns {get('turns')}  model tokens "
            f"{get('model_tokens')}  generation {get('generate_s')}s  env {get('env_s')}s",
        ]
    info = episode.get("env_info") if isinstance(episode.get("env_info"), dict) else {}
    if info.get("error"):
        kind = info.get("error_kind") or info.get("error_stage") or "env"
        meta.append(f"error ({escape(str(kind))}): {escape(str(info['error']))}")
    log = [t for t in episode.get("log") or [] if isinstance(t, dict)]
    body = "".join(f'<div class="meta">{line.strip()}</div>' for line in meta)
    labels = iter(f"advantage {a:+.3f} ({estimator})" for a in advantages or [])
    for n, turn in enumerate(log):  # the advantages follow the turns that recorded a span, in order
        body += _turn_html(n, turn, next(labels, "") if turn.get("kind") == "turn" and "span" in turn else "")
    return f'<section id="episode"><h2>Episode</h2><div id="detail">{body}</div></section>'
