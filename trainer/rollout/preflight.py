"""Fail fast before training: check each task's kwargs against its env's constructor, then build and reset it once.

A typo in a task's kwargs used to surface only inside rollouts, where every episode failed quietly and
training sat at step 0. `preflight` turns it into one `ConfigError` in seconds, naming the task, the
bad kwarg and the closest parameter names.
"""

from __future__ import annotations

import asyncio
import json

import envhub
from envhub.envinfo import check_kwargs
from envhub.errors import ConfigError, EnvhubError
from envhub.trainer.config import TaskConfig


async def check_task(task: TaskConfig, *, reset: bool = True, timeout_s: float = 120.0) -> None:
    """Build `task`'s env once (and reset it, unless `reset` is False); any failure is a ConfigError naming the task."""
    if not task.remote:
        check_kwargs(task.env, task.kwargs, where=f"task {envhub.spec(task.env).id}: ")
    if not reset:
        return
    shown = json.dumps(task.kwargs, default=str)
    try:
        env = (
            envhub.RemoteEnv(task.remote, task.env, **task.kwargs)
            if task.remote
            else envhub.make(task.env, **task.kwargs)
        )
    except Exception as exc:
        raise ConfigError(
            f"task {task.env}: cannot build the env with kwargs {shown}: {_describe(exc)}",
            hint="fix the task's kwargs in the config",
        ) from exc
    try:
        await asyncio.wait_for(env.areset(seed=0), timeout_s)
    except TimeoutError:
        raise ConfigError(
            f"task {task.env}: reset did not finish within {timeout_s:g} s",
            hint="is a sandbox backend or server reachable?",
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"task {task.env}: reset failed with kwargs {shown}: {_describe(exc)}",
            hint="fix the task's kwargs or the env; training would fail on every episode",
        ) from exc
    finally:
        try:
            await env.aclose()
        except Exception:  # closing must not hide the outcome
            pass


async def preflight(tasks: list[TaskConfig], *, reset: bool = True) -> None:
    """Check every task before training starts; stops at the first bad one with one clear error."""
    for task in tasks:
        await check_task(task, reset=reset)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, EnvhubError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
