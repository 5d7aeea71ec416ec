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


def check_harness(task: TaskConfig) -> None:
    """A harness task can run here: a single-agent env, its built-in's packages installed, bubblewrap present."""
    from envhub.sandboxes.bwrap_backend import check_bwrap
    from envhub.trainer.harness.builtin import resolve

    if not task.remote and "multi-agent" in envhub.spec(task.env).tags:
        raise ConfigError(
            f"task {task.env}: a harness plays single-agent envs, and {task.env} is multi-agent",
            hint="use its self-play variant (e.g. TicTacToe-SelfPlay-v0), or drop the task's harness",
        )
    try:
        resolve(str(task.harness), sandboxed=True)
        check_bwrap()  # every harness runs in a bubblewrap sandbox whose only way out is the gateway
    except EnvhubError as exc:
        raise ConfigError(f"task {task.env}: harness {task.harness!r}: {exc.args[0]}", hint=exc.hint) from None


async def preflight(tasks: list[TaskConfig], *, reset: bool = True) -> None:
    """Check every task before training starts; stops at the first bad one with one clear error."""
    for task in tasks:
        if task.harness is not None:
            check_harness(task)
        await check_task(task, reset=reset)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, EnvhubError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
