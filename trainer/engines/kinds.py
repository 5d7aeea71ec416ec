"""Engine kinds: the one registry of the inference engines a run can name in `engine.kind`.

A kind knows everything about its engine that the rest of the trainer needs: how to check its config, how to
build (launch) or attach it, how the learner's weights reach it, whether it is watched for outages, what Ray
rollout workers in other processes generate through, and how `envhub serve-engine --backend NAME` serves it.
Code outside `trainer/engines/` asks the kind (`engine_kind(config.engine.kind)`) and never compares kind names.

Adding a kind is one new module with an `EngineKind` subclass plus `register_engine_kind(MyKind)`, from envhub's
own table below or from a user module (`envhub train --import`, a config's `imports:`). The bundled kinds are
named here by import path and imported on first use, so naming one never loads another's dependencies.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from envhub.errors import ConfigError, EngineError
from envhub.inference import InferenceEngine

if TYPE_CHECKING:
    from envhub.trainer.engines.placement import EngineProcess

#: engine.kind names of the bundled kinds -> "module:class"
_BUNDLED = {
    "embedded": "envhub.trainer.engines.embedded.kind:EmbeddedKind",
    "sglang": "envhub.trainer.engines.sglang.kind:SGLangKind",
    "vllm": "envhub.trainer.engines.vllm.kind:VLLMKind",
}
_ALIASES = {"local": "embedded"}  # configs in the wild say `kind: local` for the embedded engine
_registered: dict[str, EngineKind] = {}
#: engine keys that only SGLang's kind reads, with their neutral values (a kind lists those it reads too in `reads`)
_SGLANG_ONLY = {"launch": None, "router_url": "", "weight_sync": "disk"}


class EngineKind:
    """One kind of engine. Subclasses set `name` and implement `build`; the defaults fit an engine that serves in
    this process (`in_process = True`) or an HTTP server that reloads weights from a saved directory."""

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    #: serves in the trainer's process: no server to die, weights handed over as tensors in place
    in_process: ClassVar[bool] = False
    #: keys of _SGLANG_ONLY this kind reads (and checks) itself
    reads: ClassVar[tuple[str, ...]] = ()

    def check(self, config: Any) -> None:
        """Raise ConfigError for settings of `config` (a TrainConfig) this kind cannot honour."""
        engine = config.engine
        stray = [
            key for key, neutral in _SGLANG_ONLY.items() if key not in self.reads and getattr(engine, key) != neutral
        ]
        if stray:
            raise ConfigError(
                f"engine.{', engine.'.join(stray)} {'is' if len(stray) == 1 else 'are'} for kind: sglang, "
                f"not kind: {self.name}",
                hint="set engine.kind: sglang, or drop those keys",
            )

    async def build(self, config: Any, model: Any, tokenizer: Any) -> InferenceEngine:
        """The engine `config.engine` describes, serving `model`'s weights (the learner keeps its own copy)."""
        raise NotImplementedError(f"engine kind {self.name} cannot build an engine")

    def watch(self, engine: InferenceEngine, config: Any) -> InferenceEngine:
        """`engine` as the run uses it: a server may die and come back, so its outages are ridden out for up to
        engine.max_outage_s; an in-process engine has no outages to ride out."""
        if self.in_process:
            return engine
        from envhub.trainer.engines.watch import WatchedEngine

        watched = WatchedEngine(engine, config.engine.max_outage_s)
        watched.start_watch()
        return watched

    async def push(self, engine: Any, learner: Any, version: int, config: Any, out_dir: Path) -> dict[str, float]:
        """Send the learner's weights, cast to the engine dtype, labelled `version`; returns the push's seconds
        (`push_s`, and whatever else the kind measures, `push_metrics`)."""
        started = time.perf_counter()
        state = await asyncio.to_thread(learner.engine_state)  # LoRA merged; gathered from every process under FSDP
        await self.send_weights(engine, state, learner, version, config, out_dir)
        return {"push_s": time.perf_counter() - started, **self.push_metrics(engine)}

    async def send_weights(
        self, engine: Any, state: dict[str, Any], learner: Any, version: int, config: Any, out_dir: Path
    ) -> None:
        """In place for an in-process engine; else a saved directory the server reloads."""
        if self.in_process:
            await engine.update_weights(state, version=version)
        else:
            await push_through_disk(engine, state, learner, version, out_dir)

    def push_metrics(self, engine: Any) -> dict[str, float]:
        """Figures of the push that just ended, beside its seconds (none by default)."""
        return {}

    async def worker_endpoint(
        self, engine: Any, *, host: str, bind: str, api_key: str | None
    ) -> tuple[str, Any | None]:
        """What rollout workers in other processes (Ray actors) generate through: comma-separated base URLs that
        the kind's `worker_client` speaks to (SGLang's native API by default, vLLM's for kind vllm), and a server
        this call started (the caller stops it) or None. The embedded kind serves its engine over the
        SGLang-compatible HTTP API on `bind`, reached at `host` (`server.app.serve_to_workers`)."""
        raise EngineError(
            f"Ray rollouts with engine.kind {self.name} are not supported",
            hint="play episodes in the trainer's process (no --ray), or use engine.kind embedded or sglang",
        )

    def worker_client(self, urls: str, *, api_key: str | None, max_outage_s: float) -> InferenceEngine:
        """The engine a Ray rollout worker generates through, given `worker_endpoint`'s URLs: by default clients
        of the SGLang-compatible API (several URLs routed least-loaded), riding out outages."""
        from envhub.trainer.engines.routing import http_engines
        from envhub.trainer.engines.watch import WatchedEngine

        return WatchedEngine(http_engines(urls, api_key=api_key), max_outage_s)

    def processes(self, config: Any, cuda: bool) -> list[EngineProcess]:
        """Where this kind's processes run (`envhub train --dry-run`): `trainer.engines.placement.EngineProcess`es;
        by default the servers named in engine.url, or one server the run starts on this machine."""
        from envhub.trainer.engines.placement import EngineProcess, attached

        if self.in_process:
            return [EngineProcess(f"{self.name} engine", "trainer")]
        if config.engine.url:
            return attached(config.engine.url, self.name, "/health")
        return [EngineProcess(f"{self.name} server", "local")]

    def serves_workers(self) -> bool:
        """Whether Ray rollout workers in other processes can generate through this kind (`worker_endpoint`)."""
        return type(self).worker_endpoint is not EngineKind.worker_endpoint

    def check_launch(self, config: Any) -> None:
        """EngineError naming the fix when this machine cannot start what the config asks of this kind (a missing
        install, no CUDA); starts nothing. By default there is nothing to check."""

    def serve(self, args: Any) -> int:
        """`envhub serve-engine --backend NAME`: serve a model in the foreground until stopped; the exit code."""
        raise EngineError(
            f"envhub serve-engine cannot serve engine kind {self.name}",
            hint=f"use --backend {' or '.join(k for k in serving_kinds())}",
        )


async def push_through_disk(engine: Any, state: dict[str, Any], learner: Any, version: int, out_dir: Path) -> None:
    """Save the weights under OUT_DIR/weights/vNNNNNN, have the server load them, and drop older copies."""
    path = out_dir / "weights" / f"v{version:06d}"
    await asyncio.to_thread(learner.export_engine_weights, path, state)
    await engine.update_weights(str(path), version=version)
    for old in path.parent.glob("v*"):  # the server has loaded this one; older copies are dead weight
        if old != path:
            await asyncio.to_thread(shutil.rmtree, old, True)


def register_engine_kind(kind: type[EngineKind] | EngineKind) -> EngineKind:
    """Make `kind` nameable in `engine.kind` and `serve-engine --backend` (a class is instantiated); returns it."""
    instance = kind() if isinstance(kind, type) else kind
    if not instance.name or not instance.name.replace("-", "_").isidentifier():
        raise ConfigError(
            f"engine kind {type(instance).__name__} needs a name of letters, digits, '-' or '_', got {instance.name!r}",
            hint='set the class attribute name = "my-engine"',
        )
    path = f"{type(instance).__module__}:{type(instance).__qualname__}"
    for name in (instance.name, *instance.aliases):
        taken = _registered.get(name)
        bundled = _BUNDLED.get(name)  # taken even before its module is imported
        if name in _ALIASES or (taken is not None and type(taken) is not type(instance)) or bundled not in (None, path):
            raise ConfigError(f"engine kind name {name!r} is taken", hint="pick another name")
        _registered[name] = instance
    return instance


def engine_kind(name: str) -> EngineKind:
    """The kind `name` (or an alias of it) names; ConfigError listing the known kinds when none does."""
    name = _ALIASES.get(name, name)
    if name not in _registered and name in _BUNDLED:
        module, _, cls = _BUNDLED[name].partition(":")
        register_engine_kind(getattr(importlib.import_module(module), cls))
    if name not in _registered:
        known = engine_kinds()
        close = difflib.get_close_matches(name, known + list(_ALIASES), n=1, cutoff=0.6)
        raise ConfigError(
            f"unknown engine kind {name!r} (known: {', '.join(known)})",
            hint=f"did you mean {close[0]!r}?"
            if close
            else "a kind from your own module is known once it is imported (--import MODULE or the config's imports:)",
        )
    return _registered[name]


def is_engine_kind(name: str) -> bool:
    """Whether `name` names a registered or bundled kind (or an alias of one), without importing anything."""
    name = _ALIASES.get(name, name)
    return name in _registered or name in _BUNDLED


def engine_kinds() -> list[str]:
    """Every kind's name, bundled ones first."""
    return list(dict.fromkeys([*_BUNDLED, *(k.name for k in _registered.values())]))


def serving_kinds() -> list[str]:
    """The kinds `envhub serve-engine` can serve."""
    return [name for name in engine_kinds() if type(engine_kind(name)).serve is not EngineKind.serve]
