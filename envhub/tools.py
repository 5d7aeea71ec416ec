"""Reusable agent tools: `@tool` turns a typed, documented function into a tool with a JSON schema.

The schema (OpenAI function-calling form) comes from the signature and the docstring's `Args:`
section. A tool may take a keyword-only `ctx: ToolContext` parameter, which the caller injects and
which is left out of the schema; sandbox tools reach their sandbox through it.

The tools here (`bash`, `python`, `view`, `str_replace_edit`, `create_file`, `submit`) need only a
sandbox with `exec`, `read_file` and `write_file`, so every sandbox backend can serve them.
"""

from __future__ import annotations

import inspect
import re
import shlex
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from envhub.errors import SandboxError

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
}


class SupportsExec(Protocol):
    """The part of `envhub.sandboxes.Sandbox` that tools rely on."""

    async def exec(
        self,
        cmd: str,
        *,
        timeout: float,
        stdin: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Any: ...
    async def read_file(self, path: str) -> bytes: ...
    async def write_file(self, path: str, data: bytes | str) -> None: ...


@dataclass
class ToolContext:
    """What a tool call may touch: the episode's sandbox, working directory and env."""

    sandbox: SupportsExec | None = None
    workdir: str = "/workspace"
    env: Any = None
    command_timeout: float = 60.0
    max_output_chars: int = 10_000
    state: dict[str, Any] = field(default_factory=dict)


class ToolError(Exception):
    """Raised inside a tool for a problem the agent should read as the tool's observation."""


class ToolTimeout(ToolError):
    """Raised by a tool whose command ran out of time; the message is what the agent reads."""


@dataclass(frozen=True)
class Tool:
    """A callable tool with its JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any]
    takes_context: bool = False
    #: a method of an env (first parameter `self`): called on the env the caller's ToolContext names
    takes_env: bool = False

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI-style tool schema: {"type": "function", "function": {name, description, parameters}}."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext | None = None) -> Any:
        kwargs = dict(arguments)
        if self.takes_context:
            kwargs["ctx"] = ctx or ToolContext()
        if self.takes_env:
            if ctx is None or ctx.env is None:
                raise ToolError(f"{self.name} is a method of an environment and needs ToolContext(env=...)")
            result = self.function(ctx.env, **kwargs)
        else:
            result = self.function(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


def _json_schema(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        return _json_schema(non_null[0]) if len(non_null) == 1 else {"anyOf": [_json_schema(a) for a in non_null]}
    if origin is typing.Literal:
        return {"type": _JSON_TYPES.get(type(args[0]), "string"), "enum": list(args)}
    if origin in (list, tuple):
        return {"type": "array", "items": _json_schema(args[0])} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    return {"type": "string"}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its summary and per-argument descriptions."""
    doc = inspect.cleandoc(doc or "")
    summary, _, rest = doc.partition("\nArgs:")
    arg_docs: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        match = re.match(r"^\s{0,8}(\w+)\s*(?:\([^)]*\))?:\s*(.*)$", line)
        if match and not line.startswith(" " * 9):
            current = match.group(1)
            arg_docs[current] = match.group(2).strip()
        elif current and line.strip():
            if re.match(r"^\s*(Returns|Raises):", line):
                current = None
                continue
            arg_docs[current] += " " + line.strip()
    return " ".join(summary.split()), arg_docs


def tool(function: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorator: make a `Tool` from a function's signature and docstring."""

    def build(fn: Callable[..., Any]) -> Tool:
        description, arg_docs = _parse_docstring(fn.__doc__ or "")
        hints = typing.get_type_hints(fn)
        properties: dict[str, Any] = {}
        required: list[str] = []
        takes_context = False
        params = list(inspect.signature(fn).parameters.values())
        takes_env = bool(params) and params[0].name == "self"
        for param in params[1:] if takes_env else params:
            if param.name == "ctx":
                takes_context = True
                continue
            prop = _json_schema(hints.get(param.name, str))
            if param.name in arg_docs:
                prop["description"] = arg_docs[param.name]
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
            elif param.default is not None:
                prop["default"] = param.default
            properties[param.name] = prop
        parameters = {"type": "object", "properties": properties, "required": required}
        return Tool(name or fn.__name__, description, parameters, fn, takes_context, takes_env)

    return build(function) if function is not None else build


# -- the shared tools ----------------------------------------------------------------------------


def _sandbox(ctx: ToolContext) -> SupportsExec:
    if ctx.sandbox is None:
        raise ToolError("this tool needs a sandbox, and the environment gave it none")
    return ctx.sandbox


def _format_exec(result: Any, limit: int, timeout: float) -> str:
    """The command's output and status as the agent reads it; raises ToolTimeout for a killed command."""
    out = (result.stdout or "") + (("\n[stderr]\n" + result.stderr) if result.stderr else "")
    if len(out) > limit:
        out = out[: limit // 2] + f"\n... [{len(out) - limit} characters cut] ...\n" + out[-limit // 2 :]
    timed_out = bool(getattr(result, "timed_out", False))
    status = f"timed out after {timeout:g} s and was killed" if timed_out else f"exit code {result.exit_code}"
    if getattr(result, "truncated", False):
        status += "; output was truncated"
    text = f"{out.rstrip()}\n[{status}]".lstrip()
    if timed_out:
        raise ToolTimeout(text)
    return text


@tool
async def bash(command: str, timeout: int | None = None, *, ctx: ToolContext) -> str:
    """Run a bash command in the sandbox's working directory and return its output and exit code.

    Args:
        command: The command line to run, e.g. "ls -la" or "python -m pytest -x tests".
        timeout: Seconds before the command is killed (defaults to the environment's limit).
    """
    limit = min(float(timeout), ctx.command_timeout) if timeout else ctx.command_timeout
    result = await _sandbox(ctx).exec(f"bash -c {shlex.quote(command)}", timeout=limit, cwd=ctx.workdir)
    return _format_exec(result, ctx.max_output_chars, limit)


@tool
async def python(code: str, *, ctx: ToolContext) -> str:
    """Run a Python 3 program in the sandbox and return what it prints.

    Args:
        code: The program's source code.
    """
    result = await _sandbox(ctx).exec("python3 -", timeout=ctx.command_timeout, stdin=code, cwd=ctx.workdir)
    return _format_exec(result, ctx.max_output_chars, ctx.command_timeout)


def _resolve(path: str, ctx: ToolContext) -> str:
    return path if path.startswith("/") else f"{ctx.workdir.rstrip('/')}/{path}"


# What is wrong with a path, in the agent's terms; probed in the sandbox after a failed read so that
# the helper command's own error text (e.g. "base64: ...") never reaches the agent.
_PATH_PROBE = (
    'if [ ! -e "$1" ]; then echo "no such file or directory"; elif [ -d "$1" ]; then echo "it is a directory"; '
    'elif [ ! -r "$1" ]; then echo "permission denied"; elif [ ! -f "$1" ]; then echo "not a regular file"; fi'
)


async def _path_problem(path: str, ctx: ToolContext, exc: Exception) -> str:
    """Why `path` cannot be read, phrased for the agent without any helper command's internals."""
    message = str(getattr(exc, "args", [""])[0] if getattr(exc, "args", None) else exc)
    if "larger than" in message:
        return message.split(": ", 1)[-1]  # "larger than N MiB", written by the sandbox itself
    try:
        probe = await _sandbox(ctx).exec(
            f"sh -c {shlex.quote(_PATH_PROBE)} probe {shlex.quote(_resolve(path, ctx))}", timeout=10
        )
        return probe.stdout.strip() or "it could not be read"
    except Exception:
        return "it could not be read"


async def _read_text(path: str, ctx: ToolContext) -> str:
    try:
        data = await _sandbox(ctx).read_file(_resolve(path, ctx))
    except (OSError, SandboxError) as exc:
        reason = getattr(exc, "strerror", None) or await _path_problem(path, ctx, exc)
        raise ToolError(f"cannot read {path}: {reason}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{path} is not a UTF-8 text file ({len(data)} bytes); inspect it with bash instead") from exc


async def _write_text(path: str, text: str, ctx: ToolContext) -> None:
    try:
        await _sandbox(ctx).write_file(_resolve(path, ctx), text.encode("utf-8"))
    except (OSError, SandboxError) as exc:
        # keep only the system's reason ("Permission denied", "No space left on device"), not the helper's name
        reason = str(exc.args[0] if exc.args else exc).rstrip().rsplit(": ", 1)[-1] or "the write failed"
        raise ToolError(f"cannot write {path}: {reason}") from exc


@tool
async def view(path: str, start_line: int | None = None, end_line: int | None = None, *, ctx: ToolContext) -> str:
    """Show a file with line numbers, or list a directory.

    Args:
        path: File or directory, relative to the working directory or absolute.
        start_line: First line to show (1-based).
        end_line: Last line to show, inclusive.
    """
    probe = await _sandbox(ctx).exec(f"test -d {shlex.quote(_resolve(path, ctx))}", timeout=10)
    if probe.exit_code == 0:
        listing = await _sandbox(ctx).exec(
            f"find {shlex.quote(_resolve(path, ctx))} -maxdepth 2 -not -path '*/.git*' | sort | head -200", timeout=10
        )
        return listing.stdout
    lines = (await _read_text(path, ctx)).splitlines()
    first = max(1, start_line or 1)
    last = min(len(lines), end_line or len(lines))
    if first > max(1, len(lines)):
        raise ToolError(f"{path} has {len(lines)} lines; start_line {first} is past the end")
    body = "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(first, last + 1))
    return body[: ctx.max_output_chars] or f"({path} is empty)"


@tool
async def str_replace_edit(path: str, old_str: str, new_str: str, *, ctx: ToolContext) -> str:
    """Replace exactly one occurrence of old_str with new_str in a file.

    Args:
        path: The file to edit.
        old_str: Text to replace; it must occur exactly once in the file (include enough context).
        new_str: The replacement text.
    """
    text = await _read_text(path, ctx)
    count = text.count(old_str) if old_str else 0
    if count != 1:
        problem = "is empty" if not old_str else ("was not found" if count == 0 else f"occurs {count} times")
        raise ToolError(f"old_str {problem} in {path}; give a unique snippet copied exactly from `view`")
    new_text = text.replace(old_str, new_str, 1)
    await _write_text(path, new_text, ctx)
    line = text[: text.index(old_str)].count("\n") + 1
    snippet = new_text.splitlines()[max(0, line - 3) : line + new_str.count("\n") + 2]
    return f"edited {path} at line {line}:\n" + "\n".join(snippet)


@tool
async def create_file(path: str, content: str, *, ctx: ToolContext) -> str:
    """Create or overwrite a file with the given content.

    Args:
        path: The file to write.
        content: The full new content of the file.
    """
    await _write_text(path, content, ctx)
    return f"wrote {len(content)} characters to {path}"


@tool
def submit(answer: str = "") -> str:
    """Submit your final answer or declare the task done; this ends the episode.

    Args:
        answer: The final answer (leave empty for tasks graded on the files you changed).
    """
    return answer


ALL_TOOLS: dict[str, Tool] = {t.name: t for t in (bash, python, view, str_replace_edit, create_file, submit)}
