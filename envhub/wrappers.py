"""Wrappers on both paths: `areset`/`astep`/`aclose` go through the same wrapper stack as `reset`/`step`/`close`.

Training, `envhub eval` and the servers drive envs through their async methods. gymnasium's wrappers only have the
sync ones, so each layer of the stack is run on the async path by what it is:

- an envhub `Wrapper` (or any layer with its own `astep`): its `areset`/`astep`;
- gymnasium's `ObservationWrapper`, `RewardWrapper` and `ActionWrapper` (and subclasses that only override their
  transform): the transform applied to the async result (to the action, for `ActionWrapper`);
- `TimeLimit`, `RecordEpisodeStatistics`, `OrderEnforcing`: their bookkeeping, kept in the wrapper's own fields, so
  both paths count the same steps; `PassiveEnvChecker` checks the sync path only (it calls `env.step` itself);
- a plain `gym.Wrapper` that overrides neither `step` nor `reset`: passed through.

A wrapper that overrides `step` or `reset` itself has no async counterpart that envhub could run without guessing;
`check_async_stack` refuses it when the env is made, naming the wrapper and the fix, instead of skipping it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import gymnasium as gym
from gymnasium.error import ResetNeeded
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, RecordEpisodeStatistics, TimeLimit

from envhub.core import run_sync
from envhub.errors import RegistrationError

#: One layer's async step: (layer, action) -> the step's five values.
AsyncStep = Callable[[Any, Any], Awaitable[tuple[Any, float, bool, bool, dict[str, Any]]]]
#: One layer's async reset: (layer, seed, options) -> (obs, info).
AsyncReset = Callable[[Any, Any, Any], Awaitable[tuple[Any, dict[str, Any]]]]


class Wrapper(gym.Wrapper):
    """Base of envhub wrappers: override `astep`/`areset` and both paths run them.

    The sync `step`/`reset` of a subclass that overrides only the async ones run them on envhub's background loop;
    a subclass that overrides both keeps its own. Left alone, each call passes through to the wrapped env.
    """

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset the wrapped env (through this wrapper's `areset` when only that is overridden)."""
        if _defines(type(self), "areset", Wrapper) and not _defines(type(self), "reset", Wrapper):
            return run_sync(self.areset(seed=seed, options=options))
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Step the wrapped env (through this wrapper's `astep` when only that is overridden)."""
        if _defines(type(self), "astep", Wrapper) and not _defines(type(self), "step", Wrapper):
            return run_sync(self.astep(action))
        return self.env.step(action)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Async `reset` through the rest of the stack."""
        return await async_reset(self.env, seed=seed, options=options)

    async def astep(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Async `step` through the rest of the stack."""
        return await async_step(self.env, action)

    async def aclose(self) -> None:
        """Async `close` through the rest of the stack."""
        await async_close(self.env)


def _defines(cls: type, name: str, base: type) -> bool:
    """Whether `cls` has its own `name`, not the one `base` gives it."""
    found = getattr(cls, name, None)
    return found is not None and found is not getattr(base, name, None)


# -- each kind of layer on the async path ----------------------------------------------------------------------------


async def _pass_step(layer: Any, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    return await async_step(layer.env, action)


async def _pass_reset(layer: Any, seed: Any, options: Any) -> tuple[Any, dict[str, Any]]:
    return await async_reset(layer.env, seed=seed, options=options)


async def _observation_step(layer: gym.ObservationWrapper, action: Any) -> tuple[Any, float, bool, bool, dict]:
    obs, reward, terminated, truncated, info = await async_step(layer.env, action)
    return layer.observation(obs), reward, terminated, truncated, info


async def _observation_reset(layer: gym.ObservationWrapper, seed: Any, options: Any) -> tuple[Any, dict[str, Any]]:
    obs, info = await async_reset(layer.env, seed=seed, options=options)
    return layer.observation(obs), info


async def _reward_step(layer: gym.RewardWrapper, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    obs, reward, terminated, truncated, info = await async_step(layer.env, action)
    return obs, layer.reward(reward), terminated, truncated, info


async def _action_step(layer: gym.ActionWrapper, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    return await async_step(layer.env, layer.action(action))


async def _time_limit_step(layer: TimeLimit, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    obs, reward, terminated, truncated, info = await async_step(layer.env, action)
    layer._elapsed_steps += 1
    if layer._elapsed_steps >= layer._max_episode_steps:
        truncated = True
    return obs, reward, terminated, truncated, info


async def _time_limit_reset(layer: TimeLimit, seed: Any, options: Any) -> tuple[Any, dict[str, Any]]:
    layer._elapsed_steps = 0
    return await async_reset(layer.env, seed=seed, options=options)


async def _order_step(layer: OrderEnforcing, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    if not layer._has_reset:
        raise ResetNeeded("Cannot call env.astep() before calling env.areset()")
    return await async_step(layer.env, action)


async def _order_reset(layer: OrderEnforcing, seed: Any, options: Any) -> tuple[Any, dict[str, Any]]:
    layer._has_reset = True
    return await async_reset(layer.env, seed=seed, options=options)


async def _statistics_step(
    layer: RecordEpisodeStatistics, action: Any
) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    obs, reward, terminated, truncated, info = await async_step(layer.env, action)
    layer.episode_returns += reward
    layer.episode_lengths += 1
    if terminated or truncated:
        elapsed = round(time.perf_counter() - layer.episode_start_time, 6)
        info[layer._stats_key] = {"r": layer.episode_returns, "l": layer.episode_lengths, "t": elapsed}
        layer.time_queue.append(elapsed)
        layer.return_queue.append(layer.episode_returns)
        layer.length_queue.append(layer.episode_lengths)
        layer.episode_count += 1
        layer.episode_start_time = time.perf_counter()
    return obs, reward, terminated, truncated, info


async def _statistics_reset(layer: RecordEpisodeStatistics, seed: Any, options: Any) -> tuple[Any, dict[str, Any]]:
    obs, info = await async_reset(layer.env, seed=seed, options=options)
    layer.episode_start_time = time.perf_counter()
    layer.episode_returns = 0.0
    layer.episode_lengths = 0
    return obs, info


# The sync method a layer's class resolves to decides how the async path runs that layer.
_ASYNC_STEP: dict[Callable[..., Any], AsyncStep] = {
    gym.Wrapper.step: _pass_step,
    gym.ObservationWrapper.step: _observation_step,
    gym.RewardWrapper.step: _reward_step,
    gym.ActionWrapper.step: _action_step,
    TimeLimit.step: _time_limit_step,
    OrderEnforcing.step: _order_step,
    RecordEpisodeStatistics.step: _statistics_step,
    PassiveEnvChecker.step: _pass_step,  # its checks call the sync env.step on the first step: sync path only
}
_ASYNC_RESET: dict[Callable[..., Any], AsyncReset] = {
    gym.Wrapper.reset: _pass_reset,
    gym.ObservationWrapper.reset: _observation_reset,
    TimeLimit.reset: _time_limit_reset,
    OrderEnforcing.reset: _order_reset,
    RecordEpisodeStatistics.reset: _statistics_reset,
    PassiveEnvChecker.reset: _pass_reset,
}


SYNC = ("step", "reset")


def _has_own_async(layer: Any) -> bool:
    return callable(getattr(type(layer), "astep", None))


def _layers(env: Any) -> Iterable[gym.Wrapper]:
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


def unsupported_layers(env: Any) -> list[str]:
    """Wrappers in `env`'s stack that the async path cannot run (each overrides `step` or `reset` itself)."""
    found = []
    for layer in _layers(env):
        cls = type(layer)
        if isinstance(layer, Wrapper):  # its astep/areset run on the async path: a sync-only override is skipped there
            runs = not any(_defines(cls, sync, Wrapper) and not _defines(cls, "a" + sync, Wrapper) for sync in SYNC)
        elif _has_own_async(layer):
            runs = True
        else:
            runs = cls.step in _ASYNC_STEP and cls.reset in _ASYNC_RESET
        if not runs:
            found.append(f"{cls.__module__}.{cls.__qualname__}")
    return found


def check_async_stack(env: Any) -> None:
    """Raise RegistrationError when a wrapper in `env`'s stack would be skipped on the async path."""
    found = unsupported_layers(env)
    if found:
        names = ", ".join(found)
        raise RegistrationError(
            f"wrapper {names} overrides step() or reset() itself, so training, `envhub eval` and `envhub serve` "
            "(which call areset/astep) cannot run it",
            hint="subclass envhub.wrappers.Wrapper and implement astep/areset (the sync calls then run them), or "
            "subclass gymnasium's ObservationWrapper, RewardWrapper or ActionWrapper and override only "
            "observation(), reward() or action()",
        )


async def async_step(env: Any, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    """`env.step(action)` on the async path, through every wrapper of `env`'s stack."""
    if _has_own_async(env):
        return await env.astep(action)
    if isinstance(env, gym.Wrapper):
        handler = _ASYNC_STEP.get(type(env).step)
        if handler is None:
            check_async_stack(env)
        return await handler(env, action)
    return env.step(action)  # a plain gymnasium env under the stack: it has only the sync API


async def async_reset(
    env: Any, *, seed: int | None = None, options: dict[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    """`env.reset(...)` on the async path, through every wrapper of `env`'s stack."""
    if _has_own_async(env):
        return await env.areset(seed=seed, options=options)
    if isinstance(env, gym.Wrapper):
        handler = _ASYNC_RESET.get(type(env).reset)
        if handler is None:
            check_async_stack(env)
        return await handler(env, seed, options)
    return env.reset(seed=seed, options=options)


async def async_close(env: Any) -> None:
    """`env.close()` on the async path: the first layer with its own `aclose` is awaited, else the sync close runs."""
    for layer in (*_layers(env), env.unwrapped):
        if callable(getattr(type(layer), "aclose", None)):
            await layer.aclose()
            return
    env.close()


def apply_wrappers(env: Any, wrappers: Iterable[Callable[[Any], Any]]) -> Any:
    """Wrap `env` with each of `wrappers` in turn (innermost first)."""
    for wrap in wrappers:
        wrapped = wrap(env)
        if not isinstance(wrapped, gym.Env):
            raise RegistrationError(
                f"wrapper {wrap!r} returned {type(wrapped).__name__}, not an env",
                hint="each wrapper is a callable env -> wrapped env, e.g. a gymnasium wrapper class or a "
                "functools.partial of one",
            )
        env = wrapped
    return env
