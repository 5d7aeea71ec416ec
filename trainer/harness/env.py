"""`HarnessEnv`: an env whose agent is an external program (a harness), started once per episode.

The program sees the gateway's per-episode handle (OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL) and the task
as text (ENVHUB_TASK: the wrapped env's system prompt and first observation). It runs under a wall clock and the
gateway's per-episode token budget. An env without tools takes the last line the program printed as its action
and gives the reward; an env with tools serves them at ENVHUB_MCP_URL (each call one env step, their rewards
summed; one with a `submit` tool that the program never called is submitted when it exits, so a SWE task grades
the patch it left). A program that crashes, hangs, never calls the model or prints nothing ends the episode as an
error carrying its stderr tail; its sandbox and its gateway key are released either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envhub.core import AgentEnv
from envhub.errors import HarnessError
from envhub.sandboxes.base import ExecResult
from envhub.trainer.gateway import EpisodeSamples, Gateway, RecordedCall, to_trajectories
from envhub.trainer.harness.builtin import resolve
from envhub.trainer.harness.runner import HarnessRunner, make_runner
from envhub.trainer.harness.tools import EnvTools

MAX_TASK_CHARS = 100_000  #: ENVHUB_TASK is an environment variable: Linux caps one at 128 KiB
TAIL_CHARS = 2000  #: how much of the program's stderr an error keeps
SUBMIT = "submit"  #: an env with this tool that the program left running is submitted when the program exits


@dataclass(frozen=True)
class HarnessEpisode:
    """One harness episode: its reward, the model calls it made, their trajectories and what went wrong."""

    reward: float
    calls: list[RecordedCall]
    samples: EpisodeSamples | None  #: None when the episode ended as an error (nothing to train on)
    error: str | None = None
    action: str = ""  #: the program's last line of stdout (what the wrapped env was given)
    exit_code: int | None = None
    duration_s: float = 0.0
    stderr_tail: str = ""
    info: dict[str, Any] = field(default_factory=dict)  #: the wrapped env's step info

    @property
    def merged(self) -> bool:
        """Whether the episode's calls merged into one trajectory."""
        return bool(self.samples and self.samples.merged)

    def as_record(self) -> dict[str, Any]:
        """A JSON-ready dict for episodes.jsonl: the outcome and every model call with its ids and logprobs."""
        return {
            "reward": self.reward,
            "error": self.error,
            "action": self.action,
            "exit_code": self.exit_code,
            "duration_s": round(self.duration_s, 3),
            "merged": self.merged,
            "samples": len(self.samples.trajectories) if self.samples else 0,
            "calls": [call.as_record() for call in self.calls],
            "stderr_tail": self.stderr_tail,
        }


def task_text(system_prompt: str, observation: str) -> str:
    """ENVHUB_TASK: the env's system prompt and first observation, a blank line between."""
    return f"{system_prompt.strip()}\n\n{observation}".strip() if system_prompt else observation


def last_line(stdout: str) -> str:
    """The program's action: its last non-blank line of standard output."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


class HarnessEnv:
    """Plays episodes of a wrapped env with an external program as the agent, its model calls served (and
    recorded) by `gateway`. `env` is an env id (made with `env_kwargs`) or a factory (each episode gets a fresh
    env); `harness` is a
    built-in harness's name (`openai-agents`) or a shell command line."""

    def __init__(
        self,
        env: str | Callable[[], AgentEnv],
        harness: str,
        gateway: Gateway,
        *,
        runner: str | HarnessRunner = "bwrap",
        wall_clock_s: float = 300.0,
        token_budget: int | None = None,
        allow_unsafe: bool = False,
        extra_env: dict[str, str] | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if wall_clock_s <= 0:
            raise HarnessError(f"wall_clock_s must be positive, got {wall_clock_s}", hint="give the program some time")
        self.env_id = env if isinstance(env, str) else getattr(env, "__name__", "env")
        self._make = (lambda: _make(env, env_kwargs or {})) if isinstance(env, str) else env
        self.gateway = gateway
        self.runner = make_runner(runner, allow_unsafe=allow_unsafe)
        self.launch = resolve(harness, self.runner.sandboxed)
        self.wall_clock_s, self.token_budget = wall_clock_s, token_budget
        self.extra_env = dict(extra_env or {})

    async def play(
        self, seed: int | None = None, *, group_id: str = "", sampling_key: str | None = None
    ) -> HarnessEpisode:
        """One episode: reset the env, run the program, step the env with its last line, close everything.
        `sampling_key` seeds the episode's model calls (`Gateway.open_episode`)."""
        env = self._make()
        try:
            obs, info = await env.areset(seed=seed)
            tools = EnvTools(env, info["tools"]) if info.get("tools") else None
            task = task_text(str(info.get("system_prompt") or ""), obs)
            if len(task) > MAX_TASK_CHARS:
                raise HarnessError(
                    f"the task text is {len(task)} characters, over ENVHUB_TASK's {MAX_TASK_CHARS}",
                    hint="shorten the env's system prompt or first observation",
                )
            return await self._run(env, task, seed, group_id, tools, sampling_key)
        finally:
            await env.aclose()

    async def _run(
        self,
        env: AgentEnv,
        task: str,
        seed: int | None,
        group_id: str,
        tools: EnvTools | None,
        sampling_key: str | None,
    ) -> HarnessEpisode:
        handle = self.gateway.open_episode(self.token_budget, tools, sampling_key)
        started = time.monotonic()
        try:
            result = await self.runner.run(
                self.gateway, handle, self.launch, {**self.extra_env, "ENVHUB_TASK": task}, self.wall_clock_s
            )
        finally:
            calls = self.gateway.close_episode(handle)
        duration = time.monotonic() - started
        action = last_line(result.stdout)
        error = self._error(result, calls, action if tools is None else "(tools)")
        base = dict(calls=calls, action=action, exit_code=result.exit_code, duration_s=duration)
        tail = result.stderr[-TAIL_CHARS:]
        if error:
            return HarnessEpisode(reward=0.0, samples=None, error=error, stderr_tail=tail, **base)
        if tools is not None:  # the env stepped on each tool call; the program's output is not an action
            if not tools.done and SUBMIT in tools.names:  # graded on what the program left (a SWE task's patch)
                await tools.call(SUBMIT, {})
            reward, info = tools.reward, tools.info
        else:
            _, reward, _, _, info = await env.astep(action)
        plain = {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool)) or v is None}
        samples = to_trajectories(
            calls,
            float(reward),
            task=self.env_id,
            group_id=group_id,
            seed=seed or 0,
            env_info=plain,
            duration_s=duration,
        )
        return HarnessEpisode(reward=float(reward), samples=samples, stderr_tail=tail, info=info, **base)

    def _error(self, result: ExecResult, calls: list[RecordedCall], action: str) -> str | None:
        tail = result.stderr.strip()[-TAIL_CHARS:] or "(no stderr)"
        if result.timed_out:
            return (
                f"the harness ran past its wall clock of {self.wall_clock_s:g} s and was killed; stderr tail:\n{tail}"
            )
        if result.exit_code != 0:
            return f"the harness exited with status {result.exit_code}; stderr tail:\n{tail}"
        if not calls:
            return f"the harness never called the model (its OPENAI_BASE_URL); stderr tail:\n{tail}"
        if not action:
            return f"the harness printed nothing: its last line of stdout is the action; stderr tail:\n{tail}"
        return None


def _make(env_id: str, kwargs: dict[str, Any]) -> AgentEnv:
    import envhub

    return envhub.make(env_id, **kwargs)
