"""The web shop: an aiohttp application and `ShopServer`, which runs it on 127.0.0.1 in a background thread.

Each episode is a session (`/s/{sid}/...`) holding its goal and purchase; the pages themselves carry
the rest of the state (query, page, selected options) in their URLs, so a browser can load any of them.
`acquire_server()` / `release_server()` share one ref-counted server per catalogue in a process.
Run `python -m envhub.envs.web.shop --port 8080` to browse the shop yourself.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import random
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from aiohttp import web

from envhub.envs.web import views
from envhub.envs.web.catalog import Catalog, Goal, build_catalog, make_goal
from envhub.envs.web.scoring import Score, score_purchase
from envhub.envs.web.search import search_index

MAX_SESSIONS = 20_000
_HTML = "text/html"


def page_number(value: str | None) -> int:
    """The results page a `page` URL parameter asks for: its number, 1 when missing or not a small number."""
    return int(value) if value and value.isdigit() and len(value) < 6 else 1


@dataclass
class ShopSession:
    """One shopper's episode: the goal and, once bought, the purchase and its score."""

    goal: Goal | None
    purchase: dict[str, object] | None = None
    score: Score | None = None
    created: float = field(default_factory=time.time)


class Shop:
    """The shop's state (catalogue, search index, sessions) and its request handlers."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.index = search_index(catalog)
        self.sessions: OrderedDict[str, ShopSession] = OrderedDict()

    def new_session(self, goal_seed: int | None) -> tuple[str, ShopSession]:
        """Open a session whose goal comes from `goal_seed` (a random one when None)."""
        seed = random.randrange(1 << 30) if goal_seed is None else goal_seed
        sid = secrets.token_hex(8)
        session = ShopSession(make_goal(self.catalog, seed))
        self.sessions[sid] = session
        while len(self.sessions) > MAX_SESSIONS:  # forget the oldest abandoned sessions
            self.sessions.popitem(last=False)
        return sid, session

    def app(self) -> web.Application:
        """The aiohttp application serving this shop."""
        app = web.Application()
        app.add_routes(
            [
                web.get("/", self.index_redirect),
                web.post("/api/sessions", self.api_create),
                web.get("/api/sessions/{sid}", self.api_state),
                web.delete("/api/sessions/{sid}", self.api_delete),
                web.get("/s/{sid}/", self.home),
                web.get("/s/{sid}/search", self.search),
                web.get("/s/{sid}/item/{asin}", self.item),
                web.post("/s/{sid}/buy", self.buy),
                web.get("/s/{sid}/done", self.done),
            ]
        )
        return app

    def _session(self, request: web.Request) -> ShopSession:
        session = self.sessions.get(request.match_info["sid"])
        if session is None:
            raise web.HTTPNotFound(
                text=views.error_page("This shopping session does not exist or has expired."), content_type=_HTML
            )
        return session

    async def index_redirect(self, request: web.Request) -> web.Response:
        sid, _ = self.new_session(None)
        raise web.HTTPSeeOther(f"/s/{sid}/")

    async def api_create(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            seed = body.get("goal_seed")
            if seed is not None and not isinstance(seed, int):
                raise ValueError("goal_seed must be an integer")
        except (ValueError, AttributeError) as exc:
            return web.json_response({"error": f"bad request: {exc}"}, status=400)
        sid, session = self.new_session(seed)
        return web.json_response({"session": sid, "instruction": session.goal.instruction, "url": f"/s/{sid}/"})

    async def api_state(self, request: web.Request) -> web.Response:
        session = self._session(request)
        score = session.score.as_dict() if session.score else None
        return web.json_response(
            {
                "instruction": session.goal.instruction if session.goal else "",
                "purchase": session.purchase,
                "score": score,
            }
        )

    async def api_delete(self, request: web.Request) -> web.Response:
        self.sessions.pop(request.match_info["sid"], None)
        return web.json_response({"deleted": True})

    async def home(self, request: web.Request) -> web.Response:
        session = self._session(request)
        return web.Response(text=views.home_page(request.match_info["sid"], session.goal), content_type=_HTML)

    async def search(self, request: web.Request) -> web.Response:
        session = self._session(request)
        query = request.query.get("q", "").strip()[:200]
        sid = request.match_info["sid"]
        if not query:
            raise web.HTTPSeeOther(f"/s/{sid}/")
        page = self.index.search(query, page_number(request.query.get("page")))
        return web.Response(text=views.results_page(sid, session.goal, page), content_type=_HTML)

    def _product(self, asin: str):
        product = self.catalog.by_asin.get(asin)
        if product is None:
            raise web.HTTPNotFound(text=views.error_page(f"No product with id {asin}."), content_type=_HTML)
        return product

    @staticmethod
    def _selected(fields, product) -> dict[str, str]:
        selected = {}
        for dim, values in product.options.items():
            value = fields.get(f"opt.{dim}")
            if value in values:
                selected[dim] = value
        return selected

    async def item(self, request: web.Request) -> web.Response:
        session = self._session(request)
        product = self._product(request.match_info["asin"])
        query = request.query.get("q", "")[:200]
        page = page_number(request.query.get("page"))
        selected = self._selected(request.query, product)
        html = views.product_page(request.match_info["sid"], session.goal, product, query, page, selected)
        return web.Response(text=html, content_type=_HTML)

    async def buy(self, request: web.Request) -> web.Response:
        session = self._session(request)
        form = await request.post()
        product = self._product(str(form.get("asin", "")))
        selected = self._selected(form, product)
        session.purchase = {"asin": product.asin, "options": selected, "price": product.price, "title": product.title}
        if session.goal is not None:
            session.score = score_purchase(session.goal, product, selected)
        raise web.HTTPSeeOther(f"/s/{request.match_info['sid']}/done")

    async def done(self, request: web.Request) -> web.Response:
        session = self._session(request)
        if session.purchase is None or session.score is None:
            raise web.HTTPSeeOther(f"/s/{request.match_info['sid']}/")
        product = self.catalog.by_asin[str(session.purchase["asin"])]
        html = views.done_page(session.goal, product, dict(session.purchase["options"]), session.score)  # type: ignore[arg-type]
        return web.Response(text=html, content_type=_HTML)


class ShopServer:
    """The shop served on `host` (default 127.0.0.1) and a free port, from its own thread and event loop."""

    def __init__(
        self, catalog_seed: int = 0, n_products: int = 1200, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.shop = Shop(build_catalog(catalog_seed, n_products))
        self.host, self.port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:41234."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Start serving in a background thread; returns the base URL once the port is bound."""
        if self._thread is not None:
            return self.url
        ready = threading.Event()
        failure: list[BaseException] = []
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._open())
            except BaseException as exc:  # reported to the caller of start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="envhub-webshop", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            self._loop.close()
            raise RuntimeError(f"the web shop could not start on {self.host}:{self.port}: {failure[0]}")
        return self.url

    async def _open(self) -> None:
        self._runner = web.AppRunner(self.shop.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the port the OS chose for port 0

    def stop(self) -> None:
        """Close every connection, stop the loop and join the thread."""
        if self._thread is None or self._loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._thread = self._loop = self._runner = None

    @property
    def running(self) -> bool:
        """Whether the server thread is serving."""
        return self._thread is not None and self._thread.is_alive()


_shared: dict[tuple[int, int], tuple[ShopServer, int]] = {}
_shared_lock = threading.Lock()


def acquire_server(catalog_seed: int = 0, n_products: int = 1200) -> ShopServer:
    """The process's shared server for this catalogue, started on first use; pair with `release_server`."""
    key = (catalog_seed, n_products)
    with _shared_lock:
        server, count = _shared.get(key, (None, 0))
        if server is None:
            server = ShopServer(catalog_seed, n_products)
            server.start()
        _shared[key] = (server, count + 1)
        return server


def release_server(server: ShopServer) -> None:
    """Drop one reference; the last one stops the server."""
    with _shared_lock:
        for key, (shared, count) in list(_shared.items()):
            if shared is server:
                if count <= 1:
                    del _shared[key]
                    server.stop()
                else:
                    _shared[key] = (shared, count - 1)
                return


@atexit.register
def _stop_all() -> None:
    with _shared_lock:
        for server, _ in _shared.values():
            server.stop()
        _shared.clear()


def main(argv: list[str] | None = None) -> None:
    """Serve the shop in the foreground for a person to browse."""
    parser = argparse.ArgumentParser(prog="python -m envhub.envs.web.shop", description="Run the envhub web shop.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--catalog-seed", type=int, default=0)
    parser.add_argument("--products", type=int, default=1200)
    args = parser.parse_args(argv)
    shop = Shop(build_catalog(args.catalog_seed, args.products))
    ready = f"WebShop with {len(shop.catalog)} products: open http://{args.host}:{args.port}/ (Ctrl-C to stop)"
    # run_app calls `print` once the port is bound, so the line also tells scripts the shop is up.
    web.run_app(shop.app(), host=args.host, port=args.port, print=lambda _: print(ready, flush=True), access_log=None)


if __name__ == "__main__":
    main()
