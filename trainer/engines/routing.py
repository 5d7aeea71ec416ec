"""MultiEngine: several inference engines behind one; turns of one episode stick to one engine.

An episode's first request goes to the engine with the fewest requests in flight; its later turns follow it
there, so that engine's prefix (radix) cache still holds the conversation. The episode is named by
`episode_key`, a context variable the rollout sets once per episode task.

Engines that may die are each wrapped in a failover `WatchedEngine` (`watched_engines`): a request that meets a
server's outage is resubmitted on another server (counted in `failovers`), pushes go to every server that
answers (one in an outage gets the latest when it is back), and the run stops only when every server is lost.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from envhub.errors import EngineError
from envhub.inference import GenerateResult, InferenceEngine, SamplingParams
from envhub.trainer.engines.protocol import episode_key

__all__ = ["MultiEngine", "episode_key", "http_engines", "watched_engines"]


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
        self.served = [0] * len(self.engines)  #: requests each engine completed
        self.failovers = 0  #: requests resubmitted on another engine after theirs met an outage
        self._picks = 0
        self._picked = [0] * len(self.engines)  # when route() last picked each engine for a new episode
        self.names = [_engine_url(e, i) for i, e in enumerate(self.engines)]  #: each engine's URL, for the record

    def _available(self, index: int) -> bool:
        return getattr(self.engines[index], "available", True)

    def route(self, key: str | None) -> int:
        """The engine for a request of episode `key`: where the episode went before, else the least loaded (of
        the engines not in an outage, when any is; of equally loaded ones, the one picked longest ago)."""
        if key is not None and key in self.sessions and self._available(self.sessions[key]):
            self.sessions.move_to_end(key)
            return self.sessions[key]
        candidates = [i for i in range(len(self.engines)) if self._available(i)] or range(len(self.engines))
        index = min(candidates, key=lambda i: (self.load[i], self._picked[i]))  # ties: the least recently picked
        self._picks += 1
        self._picked[index] = self._picks
        if key is not None:
            self.sessions[key] = index
            self.sessions.move_to_end(key)
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        return index

    async def generate(self, input_ids: list[int], sampling: SamplingParams, **kwargs: Any) -> GenerateResult:
        """Generate on the episode's engine (see `episode_key`), or the one with the fewest requests in flight;
        a request whose engine is in an outage goes to another one."""
        from envhub.trainer.engines.watch import EngineUnavailable

        while True:
            self.raise_if_failed()
            if not any(self._available(i) for i in range(len(self.engines))):
                await self._any_recovered()
            index = self.route(episode_key.get())
            self.load[index] += 1
            try:
                result = await self.engines[index].generate(input_ids, sampling, **kwargs)
            except EngineUnavailable:
                self.failovers += 1
                continue
            finally:
                self.load[index] -= 1
            self.served[index] += 1
            result.meta["engine"] = index
            result.meta["engine_url"] = self.names[index]
            return result

    async def _any_recovered(self) -> None:
        """Wait until one of the engines in an outage is back (or lost: raise_if_failed then decides)."""
        recovering = [e for e in self.engines if hasattr(e, "recovered") and not e.available and not e.lost]
        if not recovering:
            return
        waits = [asyncio.ensure_future(e.recovered()) for e in recovering]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def update_weights(self, path_or_state: Any, version: int | None = None, **kwargs: Any) -> None:
        """Update every engine to the same version (a failover engine in an outage gets it when it is back)."""
        version = self.version + 1 if version is None else version
        await asyncio.gather(*[e.update_weights(path_or_state, version=version, **kwargs) for e in self.engines])
        self.version = version

    def metrics(self) -> dict[str, float]:
        """Requests each engine served, failovers, and the watched engines' outage figures, summed."""
        # requests served here (none in the driver of a Ray run, whose workers generate)
        row: dict[str, float] = {}
        if any(self.served):
            row.update({f"engine{i}_requests": n for i, n in enumerate(self.served)})
        for engine in self.engines:
            for key, value in (engine.metrics() if hasattr(engine, "metrics") else {}).items():
                row[key] = row.get(key, 0) + value
        if self.failovers:
            row["engine_failovers"] = self.failovers
        row["engines_lost"] = sum(bool(getattr(e, "lost", False)) for e in self.engines)
        return row

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
        """Pause every engine (that is not in an outage)."""
        await asyncio.gather(*[e.pause(**kwargs) for i, e in enumerate(self.engines) if self._available(i)])

    async def resume(self) -> None:
        """Resume every engine (that is not in an outage)."""
        await asyncio.gather(*[e.resume() for i, e in enumerate(self.engines) if self._available(i)])

    def raise_if_failed(self) -> None:
        """Raise the first engine's fatal error; with failover engines, only once every one of them is lost."""
        if all(hasattr(e, "lost") for e in self.engines):
            if all(e.lost for e in self.engines):
                self.engines[0].raise_if_failed()
            return
        for engine in self.engines:
            engine.raise_if_failed()

    async def health(self) -> bool:
        """True when every engine is healthy (with failover engines: when one that is not lost is)."""
        if all(hasattr(e, "lost") for e in self.engines):
            live = [e for e in self.engines if not e.lost]
            return any(await asyncio.gather(*[e.health() for e in live])) if live else False
        return all(await asyncio.gather(*[e.health() for e in self.engines]))

    def start_watch(self) -> None:
        """Start the health probe of every watched engine (call on the running loop)."""
        for engine in self.engines:
            if hasattr(engine, "start_watch"):
                engine.start_watch()

    async def close(self) -> None:
        """Close every engine."""
        await asyncio.gather(*[e.close() for e in self.engines])


def _engine_url(engine: Any, index: int) -> str:
    from envhub.trainer.engines.watch import engine_name

    name = engine_name(engine)
    return name if "://" in name else f"engine {index}"


def watched_engines(engines: Sequence[InferenceEngine], max_outage_s: float) -> InferenceEngine:
    """One engine that rides out outages: a WatchedEngine for one server, else a MultiEngine failing over between
    failover WatchedEngines (see the module docstring). Call `start_watch` on the loop to probe them."""
    from envhub.trainer.engines.watch import WatchedEngine

    if len(engines) == 1:
        return WatchedEngine(engines[0], max_outage_s)
    return MultiEngine([WatchedEngine(e, max_outage_s, failover=True) for e in engines])


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
