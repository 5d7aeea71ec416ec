"""`AgentEnv`: the text-in, text-out gymnasium environment every envhub env is.

An env implements either the sync pair `reset`/`step` (pure-Python games) or the async pair
`areset`/`astep` (envs that wait on sandboxes or HTTP). The base class provides the other pair:
async calls run sync code inline, and sync calls drive async code on one background event loop,
so a sync user never needs to know which kind of env they hold.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
from gymnasium import spaces

from envhub.tools import Tool

T = TypeVar("T")

MAX_TEXT_LENGTH = 1 << 17


class UnicodeText(spaces.Text):
    """A `Text` space whose membership test accepts any text that can travel as UTF-8 (JSON, HTTP).

    gymnasium's `Text` checks membership against an explicit character set, which for the whole of
    Unicode would cost a large table. Sampling draws from printable ASCII (and a few non-ASCII
    characters), which is what API checkers need; `contains` accepts every code point but lone surrogates:
    observations come from real data, which carries no-break spaces, ideographic spaces and control characters
    (a backspace inside a code snippet), and all of them are text a model can be shown.
    """

    _SAMPLE_CHARS = "".join(chr(c) for c in range(32, 127)) + "\n\téüß€→中"

    def __init__(self, max_length: int = MAX_TEXT_LENGTH, *, min_length: int = 0, seed: int | None = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=self._SAMPLE_CHARS, seed=seed)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 form, so no JSON or HTTP body can carry it
            return False
        return True

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length}, charset=Unicode)"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, UnicodeText) and (self.min_length, self.max_length) == (
            other.min_length,
            other.max_length,
        )


class _BackgroundLoop:
    """One daemon thread running an event loop, shared by every env that is driven synchronously."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="envhub-sync-loop", daemon=True).start()
            loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("a sync env method was called from envhub's own loop; await the async method instead")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()


_background = _BackgroundLoop()


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, on envhub's shared background loop."""
    return _background.run(coro)


def state_digest(value: Any, size: int = 8) -> str:
    """A short hex digest of plain data (its canonical JSON, keys sorted) or of bytes, the same in every process.

    For anchors (`AgentEnv.anchor`) naming a large state (a map, a grid encoding, a page's parameters) in a few
    characters; sets must come as sorted lists, since JSON has no order-free container.
    """
    data = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(data, digest_size=size).hexdigest()


def _takes_render_mode(init: Callable[..., Any]) -> bool:
    params = inspect.signature(init).parameters.values()
    return any(p.name == "render_mode" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _with_render_mode(init: Callable[..., Any]) -> Callable[..., Any]:
    """Let an env's own `__init__` also take `render_mode`, as gymnasium's `make` and `check_env` pass it."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, render_mode: str | None = None, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.render_mode = render_mode

    signature = inspect.signature(init)
    extra = inspect.Parameter("render_mode", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None")
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    __init__.__signature__ = signature.replace(parameters=[*params[:at], extra, *params[at:]])  # type: ignore[attr-defined]
    return __init__


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(AgentEnv, name)


class TextRender:
    """`render()` for envs that draw themselves as text: returned in "ansi" mode, printed in "human" mode.

    Shared by `AgentEnv` and the multi-agent (PettingZoo) games; a class sets `render_mode` and overrides
    `render_text`.
    """

    render_mode: str | None = None

    def render(self) -> str | None:
        text = self.render_text()
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def render_text(self) -> str:
        """The current state as text (ANSI render mode); envs override this."""
        return ""


class AgentEnv(TextRender, gym.Env[str, str]):
    """A text environment for LLM agents: observations and actions are strings.

    `info` from reset carries `system_prompt` and `tools` (OpenAI-style JSON schemas of the tools
    the env accepts); actions are the model's raw text (tool calls inside it are parsed by
    `envhub.toolcalls.parse_tool_calls`) or an already-parsed tool call dict.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human"], "render_fps": 4}
    #: Tools this env accepts; their schemas go into `info["tools"]` at reset.
    tools: ClassVar[tuple[Tool, ...]] = ()
    #: Short system prompt telling a model how to act in this env.
    system_prompt: ClassVar[str] = ""

    observation_space: spaces.Space[str] = UnicodeText()
    action_space: spaces.Space[str] = UnicodeText()

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("__abstract__", False) and not (_overrides(cls, "step") or _overrides(cls, "astep")):
            raise TypeError(f"{cls.__name__} must implement step() or astep()")
        if "__init__" in cls.__dict__ and not _takes_render_mode(cls.__dict__["__init__"]):
            cls.__init__ = _with_render_mode(cls.__dict__["__init__"])  # type: ignore[method-assign]

    # Each public method below either runs the subclass's other-flavoured implementation or, when
    # reached through super() from the subclass's own implementation, does the shared base work.

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; returns the first observation and `info` (system prompt, tools)."""
        cls = type(self)
        if _overrides(cls, "areset") and not _overrides(cls, "reset"):
            return run_sync(self.areset(seed=seed, options=options))
        super().reset(seed=seed)  # seeds self.np_random
        return "", self.base_info()

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Async `reset`; the primary implementation for envs that wait on I/O."""
        cls = type(self)
        if _overrides(cls, "reset") and not _overrides(cls, "areset"):
            return self.reset(seed=seed, options=options)
        gym.Env.reset(self, seed=seed)
        return "", self.base_info()

    def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the agent's action (raw model text or a tool-call dict)."""
        return run_sync(self.astep(action))

    async def astep(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Async `step`; sync envs run inline."""
        return self.step(action)

    def close(self) -> None:
        """Release everything the env holds (sandboxes, sessions)."""
        if _overrides(type(self), "aclose") and not _overrides(type(self), "close"):
            run_sync(self.aclose())

    async def aclose(self) -> None:
        """Async `close`."""
        if _overrides(type(self), "close") and not _overrides(type(self), "aclose"):
            self.close()

    async def __aenter__(self) -> AgentEnv:
        """`async with env:` closes it (`aclose`) however the block ends; `with env:` does the same with `close`."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- helpers for subclasses -------------------------------------------------------------
    def anchor(self) -> str | None:
        """The exact state the next action acts in, as a short key that envs put in `info["anchor"]`; None: no exact
        state to name (the trainer then hashes the observation).

        Equal keys mean equal futures given the same action; no turn counter, clock or history order goes in
        (docs/authoring.md, "Anchor states for step-level credit"). `ToolEnv` adds it to every info itself.
        """
        return None

    def base_info(self, **extra: Any) -> dict[str, Any]:
        """The reset `info` every env returns: system prompt and tool schemas, plus `extra`."""
        return {"system_prompt": self.system_prompt, "tools": [t.schema for t in self.tools], **extra}


AgentEnv.__abstract__ = True  # type: ignore[attr-defined]
