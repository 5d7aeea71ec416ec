"""`WebShopEnv`: shop for what the instruction asks in the local web shop, over real HTTP.

Observations are the served page as text with clickable elements marked `[like this]`; actions are
`search[query]` (on the page with the search box) and `click[element]`, or the same as tool calls
`search(query)` / `click(element)`. The episode ends at Buy Now, scored as in WebShop (see scoring.py).

The anchor (`info["anchor"]`) names the page the agent is on as the shop serves it: its path without the session
(`/`, `/search`, `/item/B0ABC12345`, `/done`) and a digest of everything else it depends on (catalogue, goal,
query, results page, options selected), read from the URL the way the shop reads it, e.g.
`page=/item/B0ABC12345|state=9d1e04c7aa3b5f62`. The shop keeps no other state until Buy Now, so two ways to the
same page (a search typed again, or reached through Back) give the same anchor.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import aiohttp

from envhub.core import AgentEnv, state_digest
from envhub.envs.web import browser
from envhub.envs.web.catalog import Goal, build_catalog, make_goal
from envhub.envs.web.page import ParsedPage, parse_page
from envhub.envs.web.search import PAGE_SIZE, search_index
from envhub.envs.web.shop import ShopServer, acquire_server, page_number, release_server
from envhub.errors import ConfigError
from envhub.toolcalls import parse_tool_calls
from envhub.tools import tool

_ACTION = re.compile(r"\b(search|click)\s*\[\s*\[?([^\[\]\n]*?)\]?\s*\]", re.IGNORECASE)
MAX_QUERY_CHARS = 200


@tool
def search(query: str) -> str:
    """Search the shop for products; works on the page with the search box.

    Args:
        query: the words to search for, e.g. "red cotton t-shirt for men"
    """
    return query


@tool
def click(element: str) -> str:
    """Click a clickable element of the current page, written as it appears inside [ ].

    Args:
        element: the element's label, e.g. "Next >", "B0ABC12345", "size: M" or "Buy Now"
    """
    return element


def page_state(url: str) -> dict[str, Any]:
    """What a shop URL shows, without its session: the path, and on result and product pages the query, the page
    number and the options selected, each read as the shop's handlers read it."""
    parts = urlsplit(url)
    path = re.sub(r"^/s/[^/]+", "", parts.path) or "/"
    params = {name: values[0] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}
    if path == "/search":
        return {"path": path, "q": params.get("q", "").strip()[:200], "page": page_number(params.get("page"))}
    if path.startswith("/item/"):
        options = sorted((name, value) for name, value in params.items() if name.startswith("opt."))
        return {
            "path": path,
            "q": params.get("q", "")[:200],
            "page": page_number(params.get("page")),
            "options": options,
        }
    return {"path": path}


class WebShopEnv(AgentEnv):
    """Find and buy the product the instruction describes in a local web shop."""

    reward_doc = (
        "on buying, WebShop's score in [0, 1]: the share of the goal's attributes, options and price limit met, "
        "times the product-type match (1, 0.5, 0.1 or 0); 0.0 before that."
    )
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human", "screenshot"], "render_fps": 4}
    tools = (search, click)
    system_prompt = (
        "You are shopping in a web shop for the product described in the instruction. Each observation is "
        "the current page; clickable elements are shown in square brackets. Act with exactly one action per "
        "turn: search[your query] on the page with the search box, or click[element] with an element's "
        "text, e.g. click[Next >], click[B0ABC12345], click[size: M], click[Buy Now]. Select every option "
        "the instruction asks for before you click Buy Now; buying ends the episode."
    )

    def __init__(
        self,
        catalog_seed: int = 0,
        n_products: int = 1200,
        max_steps: int = 20,
        render: str = "text",
        render_mode: str | None = None,
        screenshot_dir: str | None = None,
        shop_url: str | None = None,
    ) -> None:
        if render_mode == "screenshot":
            render = "screenshot"
        if render not in ("text", "screenshot"):
            raise ConfigError(f"unknown render {render!r}", hint='use render="text" or render="screenshot"')
        if render == "screenshot":
            browser.require_chromium()
        self.render_mode = render_mode
        self.render_kind = render
        self.catalog_seed, self.n_products, self.max_steps = catalog_seed, n_products, max_steps
        self.catalog = build_catalog(catalog_seed, n_products)
        self._shop_url = shop_url.rstrip("/") if shop_url else None
        self._server: ShopServer | None = None
        self._screenshot_dir = Path(screenshot_dir) if screenshot_dir else None
        self._http: aiohttp.ClientSession | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None  # a client session serves one loop only
        self._sid: str | None = None
        self._url = ""
        self._page = ParsedPage("")
        self._obs = ""
        self._goal: Goal | None = None
        self._goal_seed = 0
        self._steps = 0
        self._done = False
        self._last_screenshot: str | None = None
        self._extra_calls = 0  # tool calls beyond the first in the last action (ignored, and said so)

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """The shop this env talks to (the process's shared server unless `shop_url` was given)."""
        if self._shop_url:
            return self._shop_url
        if self._server is None:
            self._server = acquire_server(self.catalog_seed, self.n_products)
        return self._server.url

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None or self._http.closed or self._http_loop is not loop:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
            self._http_loop = loop
        return self._http

    async def _load(self, method: str, url: str, data: dict[str, str] | None = None) -> None:
        async with self._client().request(method, urljoin(self.base_url, url), data=data) as response:
            html = await response.text()
            self._url = str(response.url)
        self._page = parse_page(html)

    async def _screenshot(self, info: dict[str, Any]) -> None:
        if self.render_kind != "screenshot":
            return
        if self._screenshot_dir is None:
            self._screenshot_dir = Path(tempfile.mkdtemp(prefix="envhub-webshop-"))
        path = self._screenshot_dir / f"{self._sid}-step{self._steps:03d}.png"
        self._last_screenshot = str(await browser.screenshot(self._url, path))
        info["screenshot"] = self._last_screenshot

    # -- gymnasium API ----------------------------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        await super().areset(seed=seed, options=options)
        goal_seed = int((options or {}).get("goal_seed", self.np_random.integers(1 << 31)))
        await self._end_session()
        async with self._client().post(
            urljoin(self.base_url, "/api/sessions"), json={"goal_seed": goal_seed}
        ) as response:
            created = await response.json()
        self._sid = created["session"]
        self._goal, self._goal_seed = make_goal(self.catalog, goal_seed), goal_seed
        if created.get("instruction") != self._goal.instruction:
            raise ConfigError(
                f"the shop at {self.base_url} has a different catalogue than this env",
                hint="start the shop and the env with the same catalog_seed and n_products",
            )
        self._steps, self._done = 0, False
        await self._load("GET", created["url"])
        self._obs = self._page.text
        info = self.base_info(instruction=self._goal.instruction, goal_seed=goal_seed, **self._step_info())
        await self._screenshot(info)
        return self._obs, info

    async def astep(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._sid is None:
            return "Call reset() to start shopping.", 0.0, False, True, {"error": "reset needed"}
        if self._done:
            return (
                "The episode is over: you already bought a product. Call reset() to shop again.",
                0.0,
                True,
                False,
                {},
            )
        self._steps += 1
        verb, argument, error = self._parse(action)
        reward, terminated, info = 0.0, False, {}
        if error is None:
            error, reward, terminated, info = await self._act(verb, argument)
        if error is None and self._extra_calls:
            error_note = (
                f"Note: one action per turn; only the first of your {self._extra_calls + 1} tool calls was run."
            )
            self._obs = f"{error_note}\n\n{self._page.text}"
        else:
            self._obs = self._page.text if error is None else f"{error}\n\n{self._page.text}"
        self._done = terminated
        truncated = not terminated and self._steps >= self.max_steps
        info.update(self._step_info())
        if error is not None:
            info["error"] = error
        await self._screenshot(info)
        return self._obs, reward, terminated, truncated, info

    async def aclose(self) -> None:
        await self._end_session()
        if self._http is not None and not self._http.closed:
            if self._http_loop is asyncio.get_running_loop():
                await self._http.close()
        self._http = None
        if self._server is not None:
            release_server(self._server)
            self._server = None

    def render(self) -> str | None:
        if self.render_kind == "screenshot" and self.render_mode == "screenshot":
            return self._last_screenshot
        return super().render()

    def render_text(self) -> str:
        return self._obs

    # -- actions ----------------------------------------------------------------------------
    def _parse(self, action: str | dict[str, Any]) -> tuple[str, str, str | None]:
        parsed = parse_tool_calls(action, self.tools)
        self._extra_calls = 0
        if parsed.errors:
            return "", "", parsed.error_message()
        self._extra_calls = max(0, len(parsed.calls) - 1)
        if parsed.calls:
            call = parsed.calls[0]
            return call.name, str(next(iter(call.arguments.values()), "")), None
        matches = list(_ACTION.finditer(parsed.text))
        if not matches:
            shown = parsed.text.strip()[:80] or "(empty)"
            return "", "", f"Invalid action {shown!r}: write search[your query] or click[element], e.g. click[Buy Now]."
        last = matches[-1]
        return last.group(1).lower(), last.group(2).strip(), None

    async def _act(self, verb: str, argument: str) -> tuple[str | None, float, bool, dict[str, Any]]:
        if verb == "search":
            form = self._page.search_form
            if form is None:
                return "Search is not available on this page: click [Back to Search] first.", 0.0, False, {}
            query = " ".join(argument.split())[:MAX_QUERY_CHARS]
            if not query:
                return (
                    "Your search is empty: write what you are looking for, e.g. search[red cotton t-shirt].",
                    0.0,
                    False,
                    {},
                )
            await self._load("GET", f"{form.action}?{urlencode({form.text_field or 'q': query})}")
            return None, 0.0, False, {}
        element = self._page.find(argument)
        if element is None:
            shown = ", ".join(f"[{label}]" for label in self._page.labels) or "none"
            return f"There is no element [{argument}] on this page. Clickable elements: {shown}.", 0.0, False, {}
        if element.form is None:
            await self._load("GET", element.href)
            return None, 0.0, False, {}
        if element.form is self._page.search_form or element.form.text_field is not None:
            return "To search, write search[your query] instead of clicking the search button.", 0.0, False, {}
        await self._load(element.form.method.upper(), element.form.action, dict(element.form.fields))
        if not self._url.rstrip("/").endswith("/done"):
            return None, 0.0, False, {}
        async with self._client().get(urljoin(self.base_url, f"/api/sessions/{self._sid}")) as response:
            state = await response.json()
        score = state.get("score") or {}
        return None, float(score.get("reward", 0.0)), True, {"score": score, "purchase": state.get("purchase")}

    def _step_info(self) -> dict[str, Any]:
        # No URL here: it holds the session id, and info must not depend on it (gymnasium's determinism check).
        return {
            "available_actions": self._page.labels,
            "has_search": self._page.search_form is not None,
            "anchor": self.anchor(),
        }

    def anchor(self) -> str | None:
        """The page's path without the session, and a digest of the catalogue, the goal and what the URL selects."""
        if self._goal is None or not self._url:
            return None
        page = page_state(self._url)
        shop = [self.catalog_seed, self.n_products, self._goal_seed]
        return f"page={page['path']}|state={state_digest([shop, page])}"

    async def _end_session(self) -> None:
        if (
            self._sid is None
            or self._http is None
            or self._http.closed
            or self._http_loop is not asyncio.get_running_loop()
        ):
            self._sid = None
            return
        try:
            async with self._http.delete(urljoin(self.base_url, f"/api/sessions/{self._sid}")):
                pass
        except aiohttp.ClientError:
            pass  # the shop is gone; nothing left to free
        self._sid = None

    # -- expert -----------------------------------------------------------------------------
    @property
    def current_url(self) -> str:
        """The full URL of the page the agent is on (a browser can load it)."""
        return self._url

    @property
    def goal(self) -> Goal | None:
        """The current episode's goal (None before reset)."""
        return self._goal

    def oracle_actions(self) -> list[str]:
        """Actions that, from the episode's first page, buy the target with the goal's options (reward 1.0)."""
        if self._goal is None:
            raise RuntimeError("call reset() before oracle_actions()")
        product = self.catalog.by_asin[self._goal.target_asin]
        index = search_index(self.catalog)
        # Search as a shopper would (the instruction's words); fall back to the title, then the id.
        shopper = " ".join([*self._goal.options.values(), *self._goal.attributes, self._goal.product_type]).lower()
        for query in (shopper, product.title.lower(), product.asin.lower()):
            ranked = index.rank(query)
            if product in ranked:
                break
        position = ranked.index(product)
        actions = [f"search[{query}]"] + ["click[Next >]"] * (position // PAGE_SIZE)
        actions.append(f"click[{product.asin}]")
        actions += [f"click[{dim}: {value}]" for dim, value in self._goal.options.items()]
        actions.append("click[Buy Now]")
        return actions
