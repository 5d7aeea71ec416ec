"""`SWEEnv`: fix a bug in a repository inside a sandbox with bash / view / str_replace_edit, then submit.

One episode = one SWE-bench instance. The repo is put into a pooled sandbox at `/workspace/repo` as a
fresh one-commit git repository at base_commit, or, for an instance with its own image, used where the image
keeps it (`/testbed`; see `envhub.envs.swe.workspace`); the first observation is the problem statement. Each
step runs ONE tool call (if an action holds several, only the first runs and the observation says so).
On `submit` or at the step limit the agent's diff (`git diff` against base, new and binary files
included) is graded in a fresh sandbox: reward 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes. A diff
that cannot be graded (the test run never starts or is killed, the sandbox fails) raises `GradingError`: no
verdict is not a reward of 0.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from envhub import toolenv
from envhub.envs.swe import grading, harness, workspace
from envhub.envs.swe.tasks import BUNDLED_TASKS, SWEInstance, load_instances
from envhub.errors import ConfigError
from envhub.toolcalls import ToolCall, ToolResult
from envhub.toolenv import SandboxSpec, SandboxToolEnv
from envhub.tools import bash, str_replace_edit, submit, view

MAX_DIFF_BYTES = 4 * 2**20
SYSTEM_PROMPT = """You are a software engineer fixing a bug in a Python repository (its path is in the first message).
Read the issue, explore the code with `view` and `bash`, reproduce the problem, edit files with
`str_replace_edit`, and run the tests (`python3 -m pytest -q`). Make one tool call per turn, written as
<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>. Call `submit` when the fix is done: your
changes to the repository are then graded by hidden tests."""


def shared_pool(backend: str = "docker", image: str | None = None, size: int = 2, max_size: int = 16) -> Any:
    """The process-wide sandbox pool for (backend, image) on the running event loop (created lazily)."""
    return toolenv.shared_pool(SandboxSpec(backend=backend, image=image, pool_size=size, max_pool_size=max_size))  # type: ignore[arg-type]


def resolve_tasks(tasks: str | Path | None, repos_dir: str | Path | None) -> tuple[list[SWEInstance], Path | None]:
    """Load the instances and find their repos_dir; the bundled set (built on first use) when `tasks` is None."""
    if tasks is None or str(tasks) == "bundled":
        from envhub.envs.swe.repos import build_bundled_repos

        return load_instances(BUNDLED_TASKS), Path(repos_dir) if repos_dir else build_bundled_repos()
    from envhub.envs.swe.datasets import load_tasks

    instances = load_tasks(tasks, with_images=repos_dir is None)
    if repos_dir is None and any(not i.image for i in instances):
        raise ConfigError(
            "repos_dir is required for instances without their own image",
            hint="pass repos_dir=DIR holding owner__name git repositories",
        )
    return instances, Path(repos_dir) if repos_dir else None


class SWEEnv(SandboxToolEnv):
    """Fix the issue in the repository; reward 1.0 iff the hidden tests pass on your diff."""

    tools = (bash, view, str_replace_edit, submit)
    system_prompt = SYSTEM_PROMPT
    reward_doc = (
        "1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes on the submitted diff plus test_patch, else 0.0"
    )
    no_call_message = (
        'No tool call found. '
        + 'Call a tool, e.g. <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>, or submit.'
    )
    tool_timeout = None  # sandbox commands carry their own hard timeout (command_timeout)

    def __init__(
        self,
        tasks: str | Path | None = None,
        repos_dir: str | Path | None = None,
        *,
        backend: str = "docker",
        image: str | None = None,
        pool: Any = None,
        max_steps: int = 40,
        command_timeout: float = 60.0,
        test_timeout: float = 300.0,
        instance_ids: list[str] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if backend not in ("docker", "bwrap", "local"):
            raise ConfigError(f"unknown sandbox backend {backend!r}", hint="use 'docker', 'bwrap' or 'local'")
        self.instances, self.repos_dir = resolve_tasks(tasks, repos_dir)
        if instance_ids is not None:
            wanted = set(instance_ids)
            self.instances = [i for i in self.instances if i.instance_id in wanted]
        if not self.instances:
            raise ConfigError("no SWE instances to run", hint="check tasks= and instance_ids=")
        self.backend, self.image, self.pool = backend, image, pool
        self.sandbox_spec = SandboxSpec(backend=backend, image=image, command_timeout=command_timeout)  # type: ignore[arg-type]
        self.max_steps, self.command_timeout, self.test_timeout = max_steps, command_timeout, test_timeout
        self.render_mode = render_mode
        self.instance: SWEInstance | None = None
        self._base = "base"
        self._reset_started = 0.0

    # -- reset: which instance, and where its repository comes from ----------------------------
    def pick_instance(self, options: dict[str, Any]) -> SWEInstance:
        """The instance of this episode: `options["instance_id"]`, `options["index"]`, else drawn from the seed."""
        if "instance_id" in options:
            matches = [i for i in self.instances if i.instance_id == options["instance_id"]]
            if not matches:
                raise ConfigError(f"unknown instance_id {options['instance_id']!r}")
            return matches[0]
        index = options.get("index", int(self.np_random.integers(len(self.instances))))
        return self.instances[index % len(self.instances)]

    def get_pool(self) -> Any:
        """`self.pool` when given, else the process-wide pool over every image the instances need."""
        return self.pool if self.pool is not None else workspace.shared_pools(self.backend, self.image)

    def open_sandbox(self) -> Any:
        """A sandbox of the instance's own image when it has one, else of the env's image."""
        assert self.instance is not None
        return workspace.acquire(self.get_pool(), self.instance)

    async def load_repository(self, sandbox: Any, instance: SWEInstance) -> str:
        """Put the instance's repository at its starting commit into `sandbox`; returns the commit to diff against."""
        return await workspace.prepare(sandbox, instance, self.repos_dir)

    async def acquire(self, options: dict[str, Any]) -> None:
        # the instance comes first: the sandbox it needs (its image) may depend on it
        self._reset_started = time.perf_counter()
        self.instance = self.pick_instance(options)
        await super().acquire(options)

    async def setup(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        assert self.instance is not None
        self._base = await self.load_repository(self.sandbox, self.instance)
        self.workdir = workspace.repo_dir(self.sandbox, self.instance)
        obs = (
            f"Repository: {self.instance.repo} (checked out at {self.workdir})\n\n"
            f"<issue>\n{self.instance.problem_statement.strip()}\n</issue>\n\n"
            f"Fix the issue by editing the repository, then call submit. You have {self.max_steps} steps."
        )
        return obs, {
            "instance_id": self.instance.instance_id,
            "repo": self.instance.repo,
            "max_steps": self.max_steps,
            "reset_seconds": round(time.perf_counter() - self._reset_started, 3),
        }

    # -- steps: tools run in the sandbox; submit and the step limit grade ----------------------
    async def call_tool(self, call: ToolCall) -> ToolResult:
        if call.name == "submit":
            return ToolResult(call, await self.grade_episode("submitted"), True)
        return await super().call_tool(call)

    async def out_of_steps(self) -> str:
        await self.grade_episode("step limit reached", truncated=True)
        return "[step limit reached; your changes were graded]"

    # -- grading -------------------------------------------------------------------------------
    async def agent_diff(self) -> tuple[str, str | None]:
        """The agent's changes as a git diff against base (new and binary files included), or an error."""
        sandbox = self.sandbox
        script = (
            "mkdir -p ../.envhub && git add -A >/dev/null 2>&1; "
            f"git diff --cached --binary --no-color --no-ext-diff {self._base} > ../.envhub/agent.diff "
            f"2>../.envhub/agent.err"
            " && stat -c %s ../.envhub/agent.diff"
        )
        result = await sandbox.exec(script, timeout=120, cwd=self.workdir, env=grading.GIT_IDENTITY)
        if result.timed_out or result.exit_code != 0:
            return (
                "",
                f"could not read the agent's changes (the repository may be broken): "
                f"{(result.stderr or result.stdout).strip()[-200:] or 'git diff failed'}",
            )
        if int(result.stdout.strip() or 0) > MAX_DIFF_BYTES:
            return "", f"the agent's diff is larger than {MAX_DIFF_BYTES // 2**20} MiB"
        data = await sandbox.read_file(self.workdir + "/../.envhub/agent.diff")
        return data.decode("utf-8", errors="replace"), None

    async def grade_episode(self, why: str, *, truncated: bool = False) -> str:
        """Grade the agent's diff in a fresh sandbox and end the episode; returns the verdict as text."""
        assert self.instance is not None
        try:
            diff, error = await self.agent_diff()
        except Exception as exc:  # a wrecked sandbox is the agent's problem, not a crash
            diff, error = "", f"could not read the agent's changes: {exc}"
        await self.release()  # give the episode's sandbox back before grading takes another
        started = time.perf_counter()
        if error:  # the agent's own doing (a wrecked repository, a huge diff): an ungraded diff scores 0
            result = grading.GradeResult(self.instance.instance_id, resolved=False, error=error, error_kind="patch")
        else:
            result = await harness.grade(
                self.instance, diff, self.get_pool(), self.repos_dir, test_timeout=self.test_timeout
            )
        if result.is_error and result.error_kind != "patch":
            # No verdict is not a reward of 0: raising makes eval count an env error and training count the episode
            # as failed (and stop once a task fails again and again), each with this message.
            await self._end_episode()
            raise grading.GradingError(
                f"{self.instance.instance_id}: the episode could not be graded ({result.error_kind}): {result.error}",
                hint="`envhub swe validate` checks each task's test setup; test_timeout= bounds the test run",
            )
        obs = f"Episode over ({why}). {'Resolved' if result.resolved else 'Not resolved'}: {result.reason}"
        return self.finish(
            obs,
            reward=1.0 if result.resolved else 0.0,
            truncated=truncated,
            resolved=result.resolved,
            reason=result.reason,
            tests=result.tests,
            diff=diff,
            grade=result.to_json(),
            grade_seconds=round(time.perf_counter() - started, 3),
        )

    def render_text(self) -> str:
        head = f"[{self.instance.instance_id} step {self.steps}/{self.max_steps}]\n" if self.instance else ""
        return head + self.last_observation
