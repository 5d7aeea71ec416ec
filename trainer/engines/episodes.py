"""Which episode a request belongs to, so that engines and routers keep an episode's turns on one server.

The rollout sets `episode_key` once per episode task; `MultiEngine` routes on it, and `SGLangEngine` sends it to
sglang-router as the `X-SMG-Routing-Key` header (its `manual` policy pins a key to one worker).
"""

from __future__ import annotations

from contextvars import ContextVar

episode_key: ContextVar[str | None] = ContextVar("envhub_episode_key", default=None)
ROUTING_HEADER = "X-SMG-Routing-Key"
