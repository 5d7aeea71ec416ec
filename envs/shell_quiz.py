"""ShellQuiz: answer a question about a generated file by running bash in a pooled sandbox, then submit the number.

A light sandboxed tool task (the same `bash` / `submit` tools and sandbox pool as SWE-v0) that a small model
can learn on a CPU: the file and question come from the seed; the answer is exact. Two questions:
how many lines contain a given word (`grep -c -w WORD notes.txt`) and how many lines the file has
(`wc -l < notes.txt`). Reward 1.0 for submitting the right number, else 0.0.

The anchor (`info["anchor"]`, a digest of the question and the file) is given while the sandbox is as `setup()`
left it: at reset, and after turns that ran no command (a reply without a tool call, a malformed one). Once a
`bash` command has run, the state is the sandbox's whole filesystem, which a command may change in ways the env
cannot see short of reading it all back; the anchor is then left out, and the trainer hashes the observation.
The step that submits ends the episode and has none either.
"""

from __future__ import annotations

import random
from typing import Any

from envhub.core import state_digest
from envhub.errors import ConfigError
from envhub.toolcalls import ToolCall, ToolResult
from envhub.toolenv import SandboxSpec, SandboxToolEnv
from envhub.tools import ToolContext, bash, submit

WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "ocean", "maple", "robot", "candle", "forest")
SYSTEM_PROMPT = (
    "You are in a Linux sandbox at /workspace. Use the bash tool to inspect files, then call submit with the "
    "answer (a number). Make one tool call per turn, written as "
    '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>.'
)


class ShellQuizEnv(SandboxToolEnv):
    """Answer a question about notes.txt with bash in a sandbox; reward 1.0 for the exact number."""

    tools = (bash, submit)
    system_prompt = SYSTEM_PROMPT
    reward_doc = "1.0 when the submitted answer equals the true count, else 0.0"
    no_call_message = (
        'No tool call found. Call bash, e.g. <tool_call>{"name": "bash", "arguments": {"command": "cat '
        'notes.txt"}}</tool_call>, '
        "or submit."
    )
    tool_timeout = None  # sandbox commands carry their own hard timeout (command_timeout)

    def __init__(
        self,
        backend: str = "docker",
        image: str | None = None,
        max_steps: int = 4,
        pool: Any = None,
        render_mode: str | None = None,
    ) -> None:
        if backend not in ("docker", "bwrap", "local"):
            raise ConfigError(f"unknown sandbox backend {backend!r}", hint="use 'docker', 'bwrap' or 'local'")
        # the pool is the process-wide one of (backend, image), shared with SWE-v0 and every other sandboxed env
        self.sandbox_spec = SandboxSpec(backend=backend, image=image, command_timeout=10.0)  # type: ignore[arg-type]
        self.pool = pool
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.answer: int | None = None
        self.command = ""
        self._ran = False
        self._task = ""  # digest of the question and the file: the state until a command runs

    async def setup(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rng = random.Random(int(self.np_random.integers(2**31)))
        lines = [" ".join(rng.choices(WORDS, k=rng.randint(2, 5))) for _ in range(rng.randint(4, 9))]
        if rng.random() < 0.5:
            word = rng.choice(WORDS)
            self.answer = sum(word in line.split() for line in lines)
            question = f"How many lines of notes.txt contain the word '{word}'?"
            self.command = f"grep -c -w {word} notes.txt"
        else:
            self.answer = len(lines)
            question = "How many lines does notes.txt have?"
            self.command = "wc -l < notes.txt"
        await self.sandbox.write_file("/workspace/notes.txt", "\n".join(lines) + "\n")
        self._ran, self._task = False, state_digest([question, lines])
        return f"{question} The file is /workspace/notes.txt.", {"question": question}

    def make_context(self) -> ToolContext:
        return ToolContext(
            sandbox=self._sandbox, workdir="/workspace", env=self, command_timeout=10.0, max_output_chars=2000
        )

    async def call_tool(self, call: ToolCall) -> ToolResult:
        if call.name != "submit":
            self._ran = True
            return await super().call_tool(call)
        given = str(call.arguments.get("answer", "")).strip()
        correct = given.lstrip("+").isdigit() and int(given) == self.answer
        observation = "Correct." if correct else f"Wrong: the answer was {self.answer}."
        return ToolResult(call, self.finish(observation, reward=1.0 if correct else 0.0), True)

    def anchor(self) -> str | None:
        """The task's digest while the sandbox is untouched and the episode goes on; None otherwise."""
        untouched = self._task and not self._ran and self._ending is None
        return f"task={self._task}" if untouched else None

    def out_of_steps(self) -> str:
        return self.finish("", truncated=True)  # the last observation stands; no note of its own

    def oracle_action(self) -> str | None:
        """The expert's next action: run the counting command, then submit the answer."""
        if self.done or self.answer is None:
            return None
        return f"submit[{self.answer}]" if self._ran else f"bash[{self.command}]"

    def render_text(self) -> str:
        return self.last_observation
