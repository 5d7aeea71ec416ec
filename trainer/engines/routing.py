"""MultiEngine: several inference engines behind one; turns of one episode stick to one engine.

An episode's first request goes to the engine with the fewest requests in flight; its later turns follow it
there, so that engine's prefix (radix) cache still holds the conversation. The episode is named by
`episode_key`, a context variable the rollout sets once per episode task.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from envhub.errors import EngineError
from envhub.inference import GenerateResult, InferenceEngine, SamplingParams
from envhub.trainer.engines.protocol import episode_key

__all__ = ["MultiEngine", "episode_key", "http_engines"]


class MultiEngine(InferenceEngine):
    """Fans weight updates, pauses and resumes out to every engine; routes episodes sticky, new ones least loaded."""

    def __init__(self, engines: Sequence[InferenceEngine], max_sessions: int = 100_000) -> None:
        if not engines:
            raise EngineError("MultiEngine needs at least one engine")
        self.engines = list(engines)
        self.load = [0] * len(self.engines)  # requests in flight per engine
        self.version = 0
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, int] = OrderedDict()  # episode key -> engine index (oldest first)

    def route(self, key: str | None) -> int:
        """The engine for a request of episode `key`: where the episode went before, else the least loaded."""
        if key is not None and key in self.sessions:
            self.sessions.move_to_end(key)
            return self.sessions[key]
        index = min(range(len(self.engines)), key=self.load.__getitem__)
        if key is not None:
            self.sessions[key] = index
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        return index

    async def generate(self, input_ids: list[int], sampling: SamplingParams, **kwargs: Any) -> GenerateResult:
        """Generate on the episode's engine (see `episode_key`), or the one with the fewest requests in flight."""
        index = self.route(episode_key.get())
        self.load[index] += 1
        try:
            result = await self.engines[index].generate(input_ids, sampling, **kwargs)
        finally:
            self.load[index] -= 1
        result.meta["engine"] = index
        return result

    async def update_weights(self, path_or_state: Any, version: int | None = None, **kwargs: Any) -> None:
        """Update every engine to the same version."""
        version = self.version + 1 if version is None else version
        await asyncio.gather(*[e.update_weights(path_or_state, version=version, **kwargs) for e in self.engines])
        self.version = version

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        backend: str,
        device: Any,
        group_name: str = "weight_update_group",
        timeout_s: float = 600.0,
    ) -> Any:
        """One process group over every server (each at its own rank offset) with the trainer as rank 0; returns
        the trainer's weight_sync.WeightGroup."""
        from envhub.trainer.engines.protocol import join_weight_group

        return await join_weight_group(
            self.engines, master_address, master_port, backend, device, group_name, timeout_s
        )

    async def update_weights_from_distributed(self, named: Any, group: Any, version: int | None = None) -> None:
        """Every server receives while rank 0 broadcasts each bucket once."""
        from envhub.trainer.engines import weight_sync
        from envhub.trainer.engines.protocol import send_buckets

        first = self.engines[0]
        if any((e.bucket_bytes, e.flattened) != (first.bucket_bytes, first.flattened) for e in self.engines):
            raise EngineError("servers of one weight group must use the same bucket size and flattening")
        version = self.version + 1 if version is None else version
        buckets = weight_sync.plan_buckets(named, first.bucket_bytes)
        await asyncio.gather(
            *[e.update_weights_from_distributed(named, group, version, broadcast=False) for e in self.engines],
            asyncio.to_thread(send_buckets, group, buckets, first.flattened),
        )
        self.version = version

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        """Every server leaves the process group."""
        await asyncio.gather(*[e.destroy_weights_update_group(group_name) for e in self.engines])

    async def abort(self, rid: str | None = None) -> None:
        """Abort `rid` (or everything) on every engine: only the one running it has it live."""
        await asyncio.gather(*[e.abort(rid) for e in self.engines])

    async def flush_cache(self) -> bool:
        """Flush every engine's prefix cache; True when all did."""
        return all(await asyncio.gather(*[e.flush_cache() for e in self.engines]))

    async def pause(self, **kwargs: Any) -> None:
        """Pause every engine."""
        await asyncio.gather(*[e.pause(**kwargs) for e in self.engines])

    async def resume(self) -> None:
        """Resume every engine."""
        await asyncio.gather(*[e.resume() for e in self.engines])

    def raise_if_failed(self) -> None:
        """Raise the first engine's fatal error."""
        for engine in self.engines:
            engine.raise_if_failed()

    async def health(self) -> bool:
        """True when every engine is healthy."""
        return all(await asyncio.gather(*[e.health() for e in self.engines]))

    async def close(self) -> None:
        """Close every engine."""
        await asyncio.gather(*[e.close() for e in self.engines])


def http_engines(urls: str, **client: Any) -> InferenceEngine:
    """A client of one SGLang-compatible server, or a MultiEngine over several comma-separated URLs.

    `client` options (api_key, pause_mode, ...) go to every SGLangEngine.
    """
    from envhub.trainer.engines.sglang.client import SGLangEngine

    parts = [u.strip() for u in urls.split(",") if u.strip()]
    if not parts:
        raise EngineError("no engine URL given", hint="set engine.url, e.g. http://127.0.0.1:30000")
    return (
        SGLangEngine(parts[0], **client) if len(parts) == 1 else MultiEngine([SGLangEngine(u, **client) for u in parts])
    )
