"""The shop is a real aiohttp web app on 127.0.0.1: pages, sessions, buying, shared server lifecycle."""

import socket

import aiohttp
import pytest

from envhub.envs.web import ShopServer, acquire_server, release_server
from envhub.envs.web.env import WebShopEnv
from envhub.envs.web.page import parse_page
from envhub.errors import ConfigError


async def test_pages_search_product_and_buy_over_http(shop_server):
    async with aiohttp.ClientSession(shop_server.url) as http:
        async with http.post("/api/sessions", json={"goal_seed": 5}) as response:
            created = await response.json()
        sid = created["session"]
        async with http.get(created["url"]) as response:
            home = await response.text()
        assert response.status == 200 and "<form" in home and created["instruction"] in home
        async with http.get(f"/s/{sid}/search", params={"q": "wireless headphones"}) as response:
            results = parse_page(await response.text())
        assert "Next >" in results.labels and "Back to Search" in results.labels
        asin = next(label for label in results.labels if label.startswith("B0"))
        async with http.get(results.find(asin).href) as response:
            product = parse_page(await response.text())
        assert "Buy Now" in product.labels and any(label.startswith("color: ") for label in product.labels)
        async with http.get(
            product.find(next(label for label in product.labels if label.startswith("color: "))).href
        ) as response:
            chosen = parse_page(await response.text())
        assert "(selected)" in chosen.text
        buy = chosen.find("Buy Now").form
        async with http.post(buy.action, data=dict(buy.fields)) as response:
            done = await response.text()
        assert str(response.url).endswith("/done") and "Your score" in done
        async with http.get(f"/api/sessions/{sid}") as response:
            state = await response.json()
        assert state["purchase"]["asin"] == asin and 0.0 <= state["score"]["reward"] <= 1.0
        async with http.get("/s/nosuchsession/") as response:
            assert response.status == 404 and "does not exist" in await response.text()
        async with http.get(f"/s/{sid}/item/B0NOTHERE0") as response:
            assert response.status == 404
        async with http.post("/api/sessions", data="not json") as response:
            assert response.status == 400


def test_shared_server_is_reused_and_stops_cleanly():
    first = acquire_server(catalog_seed=3, n_products=100)
    second = acquire_server(catalog_seed=3, n_products=100)
    assert first is second and first.running
    port = first.port
    release_server(second)
    assert first.running  # still referenced
    release_server(first)
    assert not first.running
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more


def test_two_servers_get_distinct_free_ports():
    a, b = ShopServer(n_products=50), ShopServer(n_products=50)
    try:
        assert a.start() != b.start() and a.url.startswith("http://127.0.0.1:")
    finally:
        a.stop()
        b.stop()
    a.stop()  # stopping twice is harmless


async def test_module_entry_serves_the_shop_for_a_person(tmp_path):
    import asyncio
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "envhub.envs.web.shop",
        "--port",
        str(port),
        "--products",
        "200",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert f"http://127.0.0.1:{port}/" in line.decode()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/") as response:  # a new session with a random goal
                page = parse_page(await response.text())
        assert "/s/" in str(response.url) and page.search_form is not None and "Instruction:" in page.text
        env = WebShopEnv(
            n_products=200, shop_url=f"http://127.0.0.1:{port}"
        )  # the env against a shop in another process
        try:
            await env.areset(seed=0)
            for action in env.oracle_actions():
                _, reward, *_ = await env.astep(action)
            assert reward == 1.0 and env._server is None
        finally:
            await env.aclose()
        mismatched = WebShopEnv(n_products=1200, shop_url=f"http://127.0.0.1:{port}")
        try:
            with pytest.raises(ConfigError, match="different catalogue"):
                await mismatched.areset(seed=0)
        finally:
            await mismatched.aclose()
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10) is not None
