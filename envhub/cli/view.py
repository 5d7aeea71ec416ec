"""`envhub view RUN_DIR [RUN_DIR ...]`: a local web page over one or more runs' records.

The server renders the page (envhub/cli/view_render.py, view_episodes.py): reward curves per task with every run
as a line, each run's eval.json as a table, the episode list's first page and, with `?episode=I`, that episode turn
by turn, so it reads without scripts; the page's script swaps in fragments (`/fragment/episodes`,
`/fragment/episode`) on clicks. JSON: `GET /api/runs`, `GET /api/summary?run=R` (metrics rows and a one-line index
of every episode), `GET /api/episode/{i}?run=R` (one episode in full); R defaults to the first run. Files are re-read
when they change, so the page follows a run in progress on reload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from envhub.cli.view_episodes import ListQuery, episode_detail_html, episode_list_html, parse_index
from envhub.cli.view_render import RunSummary, page_html
from envhub.errors import EnvhubError

INDEX_FIELDS = ("task", "step", "seed", "reward", "turns", "finish_reason", "group_id", "group_outcome")


@dataclass
class RunRecord:
    """The episodes, metrics and eval.json of one run directory, reloaded when its files change."""

    run_dir: Path
    label: str = ""
    episodes: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    evaluation: Any = None
    eval_summary: Any = None  #: summary.json, in an `envhub eval --out` directory
    algorithm: dict[str, Any] = field(default_factory=dict)  #: config.json's algorithm section (credit assignment)
    _signature: tuple = ()
    _lock: threading.Lock = field(default_factory=threading.Lock)  # requests refresh from worker threads

    def refresh(self) -> None:
        """Re-read the run's files if any changed since the last read."""
        from envhub.trainer.run.record import episode_files, read_episodes

        with self._lock:
            files = [*episode_files(self.run_dir), self.run_dir / "metrics.jsonl", self.run_dir / "eval.json"]
            files += [self.run_dir / "config.json", self.run_dir / "summary.json"]
            signature = _signature(files)
            if signature == self._signature:
                return
            self.episodes = read_episodes(self.run_dir)
            self.metrics = _read_jsonl(self.run_dir / "metrics.jsonl")
            self.evaluation = _read_json(self.run_dir / "eval.json")
            self.eval_summary = _read_json(self.run_dir / "summary.json")
            config = _read_json(self.run_dir / "config.json")
            algorithm = config.get("algorithm") if isinstance(config, dict) else None
            self.algorithm = algorithm if isinstance(algorithm, dict) else {}
            self._signature = signature

    def turn_advantages(self, i: int) -> tuple[str, list[float]]:
        """The run's estimator and, per model turn of episode `i`, the advantage the learner gives it."""
        from envhub.trainer.learner.credit import CreditParams, recorded_advantages

        try:
            params = CreditParams.from_mapping(self.algorithm)
            return params.advantage, recorded_advantages(self.episodes[i], self.episodes, params)
        except (TypeError, ValueError):  # a damaged record or config: the page shows the turns without advantages
            return "", []

    def index(self, run: int = 0) -> list[dict[str, Any]]:
        """A one-line summary of each episode, tagged with the run's position."""
        return [{"run": run, "i": i, **{k: e.get(k) for k in INDEX_FIELDS}} for i, e in enumerate(self.episodes)]

    def summary(self) -> dict[str, Any]:
        """Metrics rows plus an index line per episode."""
        self.refresh()
        index = [{k: v for k, v in row.items() if k != "run"} for row in self.index()]
        return {"run": str(self.run_dir), "label": self.label, "metrics": self.metrics, "episodes": index}

    def as_summary(self) -> RunSummary:
        """What the page's summary shows of this run."""
        return RunSummary(self.label, self.metrics, self.evaluation, len(self.episodes), self.eval_summary)


def _signature(files: list[Path]) -> tuple:
    """Name, size and modification time of each file that exists (one may vanish meanwhile: a shard rotating)."""
    found = []
    for path in files:
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        found.append((str(path), stat.st_size, stat.st_mtime_ns))
    return tuple(found)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash mid-write
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _read_json(path: Path) -> Any:
    """The file's JSON, None when it is missing, or {"error": ...} when it cannot be read (shown on the page)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # being rewritten, or damaged: say so instead of failing the page
        return {"error": f"{path.name}: {exc}"}


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Each run's directory name, with as many parent folders as it takes to tell runs of the same name apart."""
    parts = [p.resolve().parts for p in run_dirs]
    depth = 1
    while depth < max(len(p) for p in parts) and len({p[-depth:] for p in parts}) < len(parts):
        depth += 1
    return ["/".join(p[-depth:]) for p in parts]


class RunSet:
    """The runs on the page, in the order given."""

    def __init__(self, run_dirs: Sequence[Path]) -> None:
        self.records = [RunRecord(Path(d), label) for d, label in zip(run_dirs, run_labels(run_dirs))]

    def refresh(self) -> None:
        """Re-read every run whose files changed."""
        for record in self.records:
            record.refresh()

    def index(self) -> list[dict[str, Any]]:
        """Every run's episode index, run after run."""
        return [row for n, record in enumerate(self.records) for row in record.index(n)]

    def episodes_html(self, query: ListQuery) -> str:
        """The episode list section for `query`."""
        return episode_list_html(self.index(), [r.label for r in self.records], query)

    def detail_html(self, query: ListQuery) -> str:
        """The selected episode's section (a hint when none is selected or it does not exist)."""
        if query.episode is None:
            return episode_detail_html(None)
        record = self.records[query.episode[0]]
        i = query.episode[1]
        if i >= len(record.episodes):
            return episode_detail_html(None)
        return episode_detail_html(record.episodes[i], record.label, *record.turn_advantages(i))

    def page(self, template: str, query: ListQuery) -> str:
        """The whole page, rendered for `query`."""
        runs = [record.as_summary() for record in self.records]
        return page_html(template, runs, self.episodes_html(query), self.detail_html(query))


def make_app(run_dirs: str | Path | Sequence[str | Path]) -> Any:
    """The aiohttp application serving one run directory or several."""
    from aiohttp import web

    runs = RunSet([Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(d) for d in run_dirs])
    template = resources.files("envhub.cli").joinpath("view_static/index.html").read_text(encoding="utf-8")

    async def query(request: web.Request) -> ListQuery:
        await asyncio.to_thread(runs.refresh)  # a large record takes a while to read: not on the event loop
        return ListQuery.parse(request.query, len(runs.records))

    def html(text: str) -> web.Response:
        return web.Response(text=text, content_type="text/html")

    def record(request: web.Request) -> RunRecord | None:
        n = parse_index(request.query.get("run", "0"), len(runs.records))
        return None if n is None else runs.records[n]

    async def page(request: web.Request) -> web.Response:
        return html(runs.page(template, await query(request)))

    async def episodes(request: web.Request) -> web.Response:
        return html(runs.episodes_html(await query(request)))

    async def detail(request: web.Request) -> web.Response:
        return html(runs.detail_html(await query(request)))

    async def run_list(request: web.Request) -> web.Response:
        listing = [{"run": n, "label": r.label, "dir": str(r.run_dir)} for n, r in enumerate(runs.records)]
        return web.json_response(listing)

    async def summary(request: web.Request) -> web.Response:
        if (chosen := record(request)) is None:
            return web.json_response({"error": f"no such run; there are {len(runs.records)}"}, status=404)
        await asyncio.to_thread(chosen.refresh)
        return web.json_response(chosen.summary())

    async def episode(request: web.Request) -> web.Response:
        chosen, raw = record(request), request.match_info["i"]
        if chosen is None:
            return web.json_response({"error": f"no such run; there are {len(runs.records)}"}, status=404)
        await asyncio.to_thread(chosen.refresh)
        if (i := parse_index(raw, len(chosen.episodes))) is None:
            return web.json_response(
                {"error": f"no episode {raw[:40]!r}; there are {len(chosen.episodes)}"}, status=404
            )
        return web.json_response(chosen.episodes[i])

    app = web.Application(client_max_size=1024)
    app.add_routes(
        [
            web.get("/", page),
            web.get("/fragment/episodes", episodes),
            web.get("/fragment/episode", detail),
            web.get("/api/runs", run_list),
            web.get("/api/summary", summary),
            web.get(r"/api/episode/{i}", episode),
        ]
    )
    return app


def check_run_dirs(run_dirs: Sequence[str]) -> list[Path]:
    """The run directories as paths; EnvhubError for one that is missing, holds no record, or is named twice."""
    paths = [Path(d) for d in run_dirs]
    for path in paths:
        if not path.is_dir():
            raise EnvhubError(
                f"run directory {str(path)!r} not found", hint="pass the out_dir of a training run, e.g. runs/demo"
            )
        if not (path / "episodes.jsonl").exists() and not (path / "metrics.jsonl").exists():
            raise EnvhubError(
                f"{path} has no episodes.jsonl or metrics.jsonl", hint="run `envhub train CONFIG` first; it writes them"
            )
    resolved = [p.resolve() for p in paths]
    if len(set(resolved)) < len(resolved):
        twice = next(str(p) for p, r in zip(paths, resolved) if resolved.count(r) > 1)
        raise EnvhubError(f"run directory {twice!r} is given twice", hint="name each run directory once")
    return paths


def _cmd_view(args: argparse.Namespace) -> int:
    from aiohttp import web

    run_dirs = check_run_dirs(args.run_dirs)
    shown = " ".join(str(p) for p in run_dirs)
    print(f"envhub view: serving {shown} on http://{args.host}:{args.port}/  (Ctrl-C to stop)")
    try:
        web.run_app(make_app(run_dirs), host=args.host, port=args.port, print=None)
    except OSError as exc:
        raise EnvhubError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", hint="pick another --port"
        ) from None
    return 0


def add_commands(sub: Any) -> None:
    """Register `envhub view`."""
    p = sub.add_parser(
        "view",
        help="browse training runs (reward curves per task, eval tables, every episode turn by turn) in a local page",
    )
    p.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="a run's output directory (episodes.jsonl, metrics.jsonl)"
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(handler=_cmd_view)
