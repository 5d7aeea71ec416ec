"""`envhub view RUN_DIR`: a local web page over a training run's record (reward curves, every episode turn by turn).

The page (envhub/cli/view_static/index.html, no external assets) reads two JSON endpoints:
`GET /api/summary` (metrics rows and a one-line index of every episode) and `GET /api/episode/{i}` (one
episode in full). Files are re-read when they change, so the page follows a run in progress on reload.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from envhub.errors import EnvhubError

INDEX_FIELDS = ("task", "step", "seed", "reward", "turns", "finish_reason", "group_id", "group_outcome")


@dataclass
class RunRecord:
    """The episodes and metrics of one run directory, reloaded when its files change."""

    run_dir: Path
    episodes: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    _signature: tuple = ()

    def refresh(self) -> None:
        """Re-read the run's files if any changed since the last read."""
        from envhub.trainer.records import episode_files, read_episodes

        files = [*episode_files(self.run_dir), self.run_dir / "metrics.jsonl"]
        signature = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists())
        if signature == self._signature:
            return
        self.episodes = read_episodes(self.run_dir)
        self.metrics = _read_jsonl(self.run_dir / "metrics.jsonl")
        self._signature = signature

    def summary(self) -> dict[str, Any]:
        """Metrics rows plus an index line per episode."""
        self.refresh()
        index = [{"i": i, **{k: e.get(k) for k in INDEX_FIELDS}} for i, e in enumerate(self.episodes)]
        return {"run": str(self.run_dir), "metrics": self.metrics, "episodes": index}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a crash mid-write
            continue
    return rows


def make_app(run_dir: str | Path) -> Any:
    """The aiohttp application serving `run_dir`."""
    from aiohttp import web

    record = RunRecord(Path(run_dir))
    page = resources.files("envhub.cli").joinpath("view_static/index.html").read_text(encoding="utf-8")

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    async def summary(request: web.Request) -> web.Response:
        return web.json_response(record.summary())

    async def episode(request: web.Request) -> web.Response:
        record.refresh()
        raw = request.match_info["i"]
        if not raw.isdigit() or int(raw) >= len(record.episodes):
            return web.json_response(
                {"error": f"no episode {raw[:40]!r}; there are {len(record.episodes)}"}, status=404
            )
        return web.json_response(record.episodes[int(raw)])

    app = web.Application(client_max_size=1024)
    app.add_routes([web.get("/", index), web.get("/api/summary", summary), web.get(r"/api/episode/{i}", episode)])
    return app


def _cmd_view(args: argparse.Namespace) -> int:
    from aiohttp import web

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise EnvhubError(
            f"run directory {str(run_dir)!r} not found", hint="pass the out_dir of a training run, e.g. runs/demo"
        )
    if not (run_dir / "episodes.jsonl").exists() and not (run_dir / "metrics.jsonl").exists():
        raise EnvhubError(
            f"{run_dir} has no episodes.jsonl or metrics.jsonl", hint="run `envhub train CONFIG` first; it writes them"
        )
    print(f"envhub view: serving {run_dir} on http://{args.host}:{args.port}/  (Ctrl-C to stop)")
    try:
        web.run_app(make_app(run_dir), host=args.host, port=args.port, print=None)
    except OSError as exc:
        raise EnvhubError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", hint="pick another --port"
        ) from None
    return 0


def add_commands(sub: Any) -> None:
    """Register `envhub view`."""
    p = sub.add_parser(
        "view", help="browse a training run (reward curves, every episode turn by turn) in a local web page"
    )
    p.add_argument("run_dir", help="a training run's output directory (holds episodes.jsonl, metrics.jsonl)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(handler=_cmd_view)
