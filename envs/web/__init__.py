"""A WebShop-style environment: a local aiohttp shop with a generated catalogue, and an env that shops in it.

Names load lazily, so `python -m envhub.envs.web.shop` runs the shop module fresh.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Catalog": "catalog",
    "Goal": "catalog",
    "Product": "catalog",
    "build_catalog": "catalog",
    "make_goal": "catalog",
    "Score": "scoring",
    "score_purchase": "scoring",
    "ShopServer": "shop",
    "acquire_server": "shop",
    "release_server": "shop",
    "WebShopEnv": "env",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'envhub.envs.web' has no attribute {name!r}")
    return getattr(import_module(f"envhub.envs.web.{_EXPORTS[name]}"), name)
