"""A WebShop-style environment: a local aiohttp shop with a generated catalogue, and an env that shops in it."""

from envhub.envs.web.catalog import Catalog, Goal, Product, build_catalog, make_goal
from envhub.envs.web.scoring import Score, score_purchase
from envhub.envs.web.shop import ShopServer, acquire_server, release_server

__all__ = [
    "Catalog", "Goal", "Product", "Score", "ShopServer", "WebShopEnv",
    "acquire_server", "build_catalog", "make_goal", "release_server", "score_purchase",
]


def __getattr__(name: str):
    if name == "WebShopEnv":
        from envhub.envs.web.env import WebShopEnv

        return WebShopEnv
    raise AttributeError(name)
