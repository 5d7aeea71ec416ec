"""`ToolEnv` and `SandboxToolEnv`: the base classes for envs whose actions are tool calls.

An author declares tools (`@tool` functions, or `@tool` methods taking `self` to reach the env's
state) and writes `setup()`, which starts an episode and returns its first observation. The base
class parses each action with `envhub.toolcalls`, runs up to `max_calls_per_step` calls (each under
`tool_timeout`), and turns every problem (malformed call, unknown tool, bad arguments, a tool that
raises or runs out of time) into observation text the agent can read. A tool ends the episode with
`self.finish(...)` and shapes rewards with `self.add_reward(...)`.

`SandboxToolEnv` adds an isolated sandbox per episode: acquired from a pool shared by every env with
the same `SandboxSpec` at reset, released when the episode ends, at the next reset and on close;
tools reach it through `ctx.sandbox` and `setup()` through `self.sandbox`.

Envs whose tools and hooks are all plain functions run their sync API inline (no event loop, no
thread); anything async is driven on envhub's shared loop, as for every `AgentEnv`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
import weakref
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from envhub.core import AgentEnv, run_sync
from envhub.errors import ResetNeeded, SandboxError
from envhub.toolcalls import ToolCall, ToolResult, parse_tool_calls, run_tool_call
from envhub.tools import ToolContext

MAX_OBSERVATION_CHARS = 100_000
StepResult = tuple[str, float, bool, bool, dict[str, Any]]


def printable(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """Text fit for the observation space: control characters (binary output) shown as \ufffd, length capped."""
    text = text[:limit]
    if text.replace("\n", "").replace("\t", "").isprintable():  # the common case, at C speed
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else "\ufffd" for c in text)


@dataclass
class _Ending:
    """How a tool ended the episode."""

    observation: str
    reward: float
    truncated: bool
    info: dict[str, Any]


def _run_inline(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits on I/O to completion without an event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError(
        "a sync tool env awaited I/O; make the tool or hook `async` so envhub drives it on an event loop"
    )


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class ToolEnv(AgentEnv):
    """An env whose actions are tool calls; subclasses declare `tools` and implement `setup()`.

    Reward: whatever the env's tools give with `add_reward()` / `finish(reward=...)`; 0.0 otherwise.
    """

    #: How many tool calls of one action run (in order); 0 runs them all.
    max_calls_per_step: ClassVar[int] = 1
    #: Wall-clock seconds one async tool call may take before it is stopped and reported as timed out.
    tool_timeout: ClassVar[float | None] = 120.0
    #: Steps before `out_of_steps()` ends the episode (None: no limit of the env's own).
    max_steps: int | None = None
    #: The observation for an action holding no tool call (when `on_text` does not handle it); "" names the tools.
    no_call_message: ClassVar[str] = ""

    # per-episode state; class-level defaults so subclasses need not call super().__init__()
    steps: int = 0
    last_observation: str = ""
    _active: bool = False
    _ending: _Ending | None = None
    _step_reward: float = 0.0
    _context: ToolContext | None = None

    # -- what an author writes ------------------------------------------------------------------
    def setup(self, options: dict[str, Any]) -> str | tuple[str, dict[str, Any]]:
        """Start an episode (self.np_random is seeded); return the first observation, optionally with extra info."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement setup(options) returning the first observation"
        )

    def on_text(self, text: str) -> str | None:
        """Handle an action without tool calls (e.g. a plain-text answer); None gives `no_call_message`."""
        return None

    def observe(self, text: str) -> str:
        """The observation for a step's text (tool outputs, notes and errors); override to append e.g. a board."""
        return text

    def step_info(self) -> dict[str, Any]:
        """Extra `info` entries after each step."""
        return {}

    def out_of_steps(self) -> str:
        """Called when `max_steps` is reached without an ending; the default truncates the episode."""
        return self.finish("[step limit reached]", truncated=True)

    def make_context(self) -> ToolContext:
        """The ToolContext tools receive for this episode (one per episode, so `ctx.state` persists)."""
        return ToolContext(env=self)

    async def call_tool(self, call: ToolCall) -> ToolResult:
        """Run one validated call; override to intercept particular tools."""
        return await run_tool_call(call, self.tools, self.context, timeout=self.tool_timeout)

    async def acquire(self, options: dict[str, Any]) -> None:
        """Take what an episode needs (e.g. a sandbox) before `setup()` runs; `options` are reset's."""

    async def release(self) -> None:
        """Free what the episode holds (sandboxes, connections); called when it ends, at reset and on close."""

    # -- what tools call --------------------------------------------------------------------------
    def finish(self, observation: str = "", *, reward: float = 0.0, truncated: bool = False, **info: Any) -> str:
        """End the episode after this step with `reward` added; returns `observation` for the tool to return."""
        self._ending = _Ending(observation, float(reward), truncated, info)
        return observation

    def add_reward(self, value: float) -> None:
        """Add a (shaped) reward to the current step."""
        self._step_reward += float(value)

    @property
    def context(self) -> ToolContext:
        """This episode's ToolContext."""
        if self._context is None:
            self._context = self.make_context()
        return self._context

    @property
    def done(self) -> bool:
        """Whether the episode has ended (or none has started); solvers and tests may set it to False to play on."""
        return not self._active

    @done.setter
    def done(self, value: bool) -> None:
        self._active = not value

    # -- the gymnasium API ----------------------------------------------------------------------
    def _is_sync(self) -> bool:
        """True when no hook the subclass wrote and no tool is async: the sync API then runs inline."""
        cached = self.__dict__.get("_sync")
        if cached is None:
            hooks = (
                "setup",
                "on_text",
                "observe",
                "step_info",
                "out_of_steps",
                "make_context",
                "call_tool",
                "acquire",
                "release",
            )
            cls = type(self)
            overridden = [getattr(cls, h) for h in hooks if getattr(cls, h) is not getattr(ToolEnv, h)]
            cached = not any(inspect.iscoroutinefunction(f) for f in overridden) and not any(
                inspect.iscoroutinefunction(t.function) for t in self.tools
            )
            self.__dict__["_sync"] = cached
        return cached

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        coro = self.areset(seed=seed, options=options)
        return _run_inline(coro) if self._is_sync() else run_sync(coro)

    def step(self, action: str | dict[str, Any]) -> StepResult:
        coro = self.astep(action)
        return _run_inline(coro) if self._is_sync() else run_sync(coro)

    def close(self) -> None:
        coro = self.aclose()
        _run_inline(coro) if self._is_sync() else run_sync(coro)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        await self._end_episode()
        await super().areset(seed=seed, options=options)  # seeds self.np_random
        self.steps, self._ending, self._context = 0, None, None
        await self.acquire(dict(options or {}))
        try:
            started = await _maybe_await(self.setup(dict(options or {})))
        except BaseException:
            await self.release()
            raise
        obs, extra = started if isinstance(started, tuple) else (started, {})
        self._active = True
        self.last_observation = obs = printable(obs)
        return obs, self._with_anchor(self.base_info(**extra))

    async def astep(self, action: str | dict[str, Any]) -> StepResult:
        if not self._active:
            raise ResetNeeded("step() called before reset() or after the episode ended", hint="call reset() first")
        self.steps += 1
        self._step_reward, self._ending = 0.0, None
        parsed = parse_tool_calls(action, self.tools)
        info: dict[str, Any] = {"step": self.steps}
        if parsed.calls:
            text, info["tool_calls"] = await self._run_calls(parsed.calls)
            info["tool"] = parsed.calls[0].name
            if parsed.errors:
                text += "\n" + parsed.error_message()
        elif parsed.errors:
            text = parsed.error_message()
        else:
            handled = await _maybe_await(self.on_text(parsed.text))
            text = (self.no_call_message or self._default_no_call_message()) if handled is None else handled
        if self._ending is None and self.max_steps is not None and self.steps >= self.max_steps:
            note = await _maybe_await(self.out_of_steps())
            text = f"{text}\n{note}" if note else text
        ending = self._ending
        obs = printable(await _maybe_await(self.observe(text)))
        info.update(await _maybe_await(self.step_info()))
        self._with_anchor(info)
        reward = self._step_reward
        if ending is not None:
            info.update(ending.info)
            reward += ending.reward
            await self._end_episode()
        self.last_observation = obs
        terminated = ending is not None and not ending.truncated
        return obs, reward, terminated, ending is not None and ending.truncated, info

    async def aclose(self) -> None:
        await self._end_episode()

    async def _run_calls(self, calls: tuple[ToolCall, ...]) -> tuple[str, list[dict[str, Any]]]:
        """Run the calls this step allows; their outputs joined, plus notes on what did not run."""
        allowed = list(calls[: self.max_calls_per_step or len(calls)])
        results: list[ToolResult] = []
        for call in allowed:
            if self._ending is not None:
                break
            results.append(await self.call_tool(call))
        if len(results) == 1:
            text = results[0].output
        else:
            text = "\n\n".join(f"[{i}: {r.call.name}]\n{r.output}" for i, r in enumerate(results, start=1))
        if len(calls) > len(allowed):
            ran = "the first" if len(allowed) == 1 else f"the first {len(allowed)}"
            per_step = "one call" if len(allowed) == 1 else f"at most {len(allowed)} calls"
            text += f"\n[note: only {ran} of your {len(calls)} tool calls ran; make {per_step} per step]"
        if len(results) < len(allowed):
            text += (
                f"\n[note: the episode ended at call {len(results)}; the {len(allowed) - len(results)} call(s) "
                f"after it did not run]"
            )
        summary = [{"name": r.call.name, "ok": r.ok, "timed_out": r.timed_out} for r in results]
        return text, summary

    def _with_anchor(self, info: dict[str, Any]) -> dict[str, Any]:
        """`info` with the env's `anchor()` under "anchor", when it gives one."""
        anchor = self.anchor()
        if anchor is not None:
            info["anchor"] = anchor
        return info

    def _default_no_call_message(self) -> str:
        names = [t.name for t in self.tools]
        example = f'<tool_call>{{"name": "{names[0]}", "arguments": {{...}}}}</tool_call>' if names else "a tool call"
        return f"No tool call found. Call one of your tools ({', '.join(names) or 'none'}), written as {example}."

    async def _end_episode(self) -> None:
        self._active = False
        await self.release()


ToolEnv.__abstract__ = True  # type: ignore[attr-defined]


@dataclass(frozen=True)
class SandboxSpec:
    """Where a `SandboxToolEnv`'s episodes run: backend, image, resource limits and pool sizes."""

    backend: Literal["docker", "bwrap", "local"] = "docker"
    image: str | None = None  #: docker image tag or bwrap rootfs; None: the bundled base image
    limits: Any = None  #: an `envhub.sandboxes.SandboxLimits`; None: the defaults
    workdir: str = "/workspace"  #: where tools run (`ctx.workdir`)
    command_timeout: float = 60.0  #: default seconds for one sandbox command (`ctx.command_timeout`)
    pool_size: int = 2  #: warm spares the shared pool keeps
    max_pool_size: int = 16  #: sandboxes the shared pool hands out at once (acquire waits beyond)


# One pool per (spec, event loop): pools hold loop-bound resources, and a loop that is gone takes its pools along.
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], Any]] = weakref.WeakKeyDictionary()


def shared_pool(spec: SandboxSpec) -> Any:
    """The process-wide `SandboxPool` for `spec` on the running event loop (created lazily, started on first
    acquire)."""
    from envhub.sandboxes import SandboxPool

    if spec.backend not in ("docker", "bwrap", "local"):
        raise SandboxError(f"unknown sandbox backend {spec.backend!r}", hint="use 'docker', 'bwrap' or 'local'")
    pools = _pools.setdefault(asyncio.get_running_loop(), {})
    key = (spec.backend, spec.image, repr(spec.limits), spec.pool_size, spec.max_pool_size)
    if key not in pools:
        pools[key] = SandboxPool(
            backend=spec.backend, image=spec.image, size=spec.pool_size, max_size=spec.max_pool_size, limits=spec.limits
        )
    return pools[key]


class SandboxToolEnv(ToolEnv):
    """A `ToolEnv` whose episodes each hold a fresh sandbox from a warm pool.

    Reward: whatever the env's tools give with `add_reward()` / `finish(reward=...)`; 0.0 otherwise.
    """

    #: The sandbox every episode gets; override per instance with `self.sandbox_spec = SandboxSpec(...)`.
    sandbox_spec: ClassVar[SandboxSpec] = SandboxSpec()
    #: An explicit `SandboxPool` to draw from instead of the shared one (e.g. one the caller sized).
    pool: Any = None
    #: Working directory of the tools for this episode (`setup()` may change it, e.g. to a repo).
    workdir: str = ""
    _sandbox: Any = None
    _stack: contextlib.AsyncExitStack | None = None
    acquire_s: float = 0.0  #: seconds the last reset waited for its sandbox (the run record's acquire latency)

    @property
    def sandbox(self) -> Any:
        """This episode's sandbox (`exec`, `read_file`, `write_file`); SandboxError outside an episode."""
        if self._sandbox is None:
            raise SandboxError("no sandbox: the episode has not started or has ended", hint="call reset() first")
        return self._sandbox

    def get_pool(self) -> Any:
        """The pool episodes draw from: `self.pool` when set, else the shared pool of `sandbox_spec`."""
        return self.pool if self.pool is not None else shared_pool(self.sandbox_spec)

    def make_context(self) -> ToolContext:
        return ToolContext(
            sandbox=self._sandbox,
            workdir=self.workdir or self.sandbox_spec.workdir,
            env=self,
            command_timeout=self.sandbox_spec.command_timeout,
        )

    def open_sandbox(self) -> AbstractAsyncContextManager[Any]:
        """The context manager that yields this episode's sandbox; override to choose one per episode (e.g. by
        image)."""
        return self.get_pool().acquire()

    async def acquire(self, options: dict[str, Any]) -> None:
        """Take a fresh sandbox for the episode that is starting."""
        stack = contextlib.AsyncExitStack()
        started = time.monotonic()
        self._sandbox = await stack.enter_async_context(self.open_sandbox())
        self.acquire_s = time.monotonic() - started
        self._stack = stack
        self.workdir = type(self).workdir

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Reset with a fresh sandbox; `info["sandbox_acquire_s"]` says how long the pool took to hand it out."""
        obs, info = await super().areset(seed=seed, options=options)
        return obs, {**info, "sandbox_acquire_s": round(self.acquire_s, 4)}

    async def release(self) -> None:
        """Give the sandbox back to the pool (it is destroyed there and a fresh spare takes its place)."""
        stack, self._stack, self._sandbox, self._context = self._stack, None, None, None
        if stack is not None:
            await stack.aclose()


SandboxToolEnv.__abstract__ = True  # type: ignore[attr-defined]
