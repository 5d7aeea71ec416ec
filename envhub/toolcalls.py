"""The one tool-call parser: model text (or an already-parsed dict) in, `ToolCall`s and readable errors out.

Accepted forms, in order of preference:
  * Hermes / Qwen: `<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>` (one or more)
  * a JSON object (bare, or in a ```json fence): `{"name": ..., "arguments": {...}}`; `parameters`/`args`
    are accepted for `arguments`, and `arguments` may itself be a JSON string
  * dicts: a single call as above, OpenAI's `{"type": "function", "function": {...}}`, or an assistant
    message `{"content": ..., "tool_calls": [...]}`

Nothing here raises on bad input: problems become `ParsedAction.errors`, phrased for the agent.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from envhub.tools import Tool, ToolContext, ToolError, ToolTimeout

_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:json|tool_call)?\s*\n(.*?)```", re.DOTALL)
FORMAT_HINT = 'write a tool call as <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>'
MAX_ACTION_CHARS = 200_000


@dataclass(frozen=True)
class ToolCall:
    """One call of a named tool with JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class ParsedAction:
    """What the parser found in one action: the prose, the calls, and problems for the agent to read."""

    text: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    def error_message(self) -> str:
        """All problems as one observation the agent can act on."""
        return "Your action could not be executed:\n" + "\n".join(f"- {e}" for e in self.errors)


def action_text(action: Any) -> str:
    """Coerce any action to text: bytes are decoded (bad bytes replaced), dicts become their content."""
    if isinstance(action, bytes):
        return action.decode("utf-8", errors="replace")
    if isinstance(action, dict):
        return str(action.get("content") or "")
    return action if isinstance(action, str) else str(action)


def parse_tool_calls(action: Any, tools: Iterable[Tool] | None = None) -> ParsedAction:
    """Parse `action` into tool calls, validating them against `tools` when given."""
    known = {t.name: t for t in tools} if tools is not None else None
    errors: list[str] = []
    raw: list[Any] = []
    if isinstance(action, dict):
        text = action_text(action)
        if "tool_calls" in action:
            raw.extend(action.get("tool_calls") or [])
        elif {"name", "function"} & set(action):
            raw.append(action)
        elif text:
            return parse_tool_calls(text, tools)
    else:
        text = action_text(action)
        if isinstance(action, bytes) and "\ufffd" in text:
            errors.append("your action contained bytes that are not valid UTF-8; they were replaced with �")
        if len(text) > MAX_ACTION_CHARS:
            return ParsedAction(
                text[:MAX_ACTION_CHARS],
                (),
                (f"your action is {len(text)} characters long; the limit is {MAX_ACTION_CHARS}",),
            )
        tagged = _TAGGED.findall(text)
        if tagged:
            raw.extend(tagged)
            text = _TAGGED.sub("", text).strip()
        else:
            candidates = _FENCED.findall(text) or ([text.strip()] if text.strip().startswith("{") else [])
            for chunk in candidates:
                try:
                    obj = json.loads(chunk)
                except json.JSONDecodeError:
                    continue
                if isinstance(obj, dict) and ({"name", "function"} & set(obj)):
                    raw.append(obj)
    calls = []
    for index, item in enumerate(raw, start=1):
        call = _to_call(item, index, errors)
        if call is not None and known is not None:
            call = _validate(call, known, errors)
        if call is not None:
            calls.append(call)
    return ParsedAction(text, tuple(calls), tuple(errors))


def _to_call(item: Any, index: int, errors: list[str]) -> ToolCall | None:
    where = f"tool call {index}"
    if isinstance(item, str):
        body = item.strip()
        if not body:
            errors.append(f"{where} is empty; {FORMAT_HINT}")
            return None
        try:
            item = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(
                f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); {FORMAT_HINT}"
            )
            return None
    if not isinstance(item, dict):
        errors.append(f"{where} must be a JSON object, got {type(item).__name__}; {FORMAT_HINT}")
        return None
    call_id = str(item.get("id", ""))
    if isinstance(item.get("function"), dict):  # OpenAI form
        item = item["function"]
    name = item.get("name") or item.get("tool")
    if not isinstance(name, str) or not name:
        errors.append(f'{where} has no "name"; {FORMAT_HINT}')
        return None
    arguments = next((item[k] for k in ("arguments", "parameters", "args") if k in item), {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            errors.append(f'the "arguments" of {where} ({name}) are not valid JSON: {exc.msg}')
            return None
    if not isinstance(arguments, dict):
        errors.append(f'the "arguments" of {where} ({name}) must be a JSON object, got {type(arguments).__name__}')
        return None
    return ToolCall(name, arguments, call_id)


def _validate(call: ToolCall, known: dict[str, Tool], errors: list[str]) -> ToolCall | None:
    tool = known.get(call.name)
    if tool is None:
        errors.append(f"unknown tool {call.name!r}; available tools: {', '.join(sorted(known)) or 'none'}")
        return None
    props: dict[str, Any] = tool.parameters.get("properties", {})
    missing = [p for p in tool.parameters.get("required", []) if p not in call.arguments]
    extra = [a for a in call.arguments if a not in props]
    if missing or extra:
        parts = ([f"missing required argument(s) {', '.join(missing)}"] if missing else []) + (
            [f"unexpected argument(s) {', '.join(extra)}"] if extra else []
        )
        errors.append(f"{call.name}: {'; '.join(parts)}; it takes {', '.join(props) or 'no arguments'}")
        return None
    arguments = {}
    for key, value in call.arguments.items():
        coerced = _coerce(value, props[key])
        if coerced is _INVALID:
            schema = props[key]
            expected = (
                "one of " + ", ".join(map(str, schema["enum"])) if "enum" in schema else schema.get("type", "a value")
            )
            errors.append(f"{call.name}: argument {key!r} should be {expected}, got {json.dumps(value)[:80]}")
            return None
        arguments[key] = coerced
    return ToolCall(call.name, arguments, call.id)


_INVALID = object()


def _coerce(value: Any, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if value is None or kind is None:
        return value
    if "enum" in schema and value not in schema["enum"]:
        return _INVALID
    if kind == "string":
        return (
            value if isinstance(value, str) else (json.dumps(value) if isinstance(value, (dict, list)) else str(value))
        )
    if kind == "integer":
        if isinstance(value, bool):
            return _INVALID
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
            return int(value)
        return _INVALID
    if kind == "number":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        try:
            return float(value)
        except (TypeError, ValueError):
            return _INVALID
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        return {"true": True, "false": False}.get(str(value).lower(), _INVALID)
    if kind == "array":
        return value if isinstance(value, list) else _INVALID
    if kind == "object":
        return value if isinstance(value, dict) else _INVALID
    return value


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call: its output as the agent will read it, whether it succeeded, whether it timed out."""

    call: ToolCall
    output: str
    ok: bool
    timed_out: bool = False


async def run_tool_call(
    call: ToolCall, tools: Iterable[Tool], ctx: ToolContext | None = None, *, timeout: float | None = None
) -> ToolResult:
    """Execute a validated call; any failure (a timeout after `timeout` seconds included) becomes a readable
    `ToolResult` with ok=False."""
    known = {t.name: t for t in tools}
    tool = known.get(call.name)
    if tool is None:
        return ToolResult(
            call, f"error: unknown tool {call.name!r}; available tools: {', '.join(sorted(known))}", False
        )
    try:
        if timeout is not None and inspect.iscoroutinefunction(tool.function):
            output = await asyncio.wait_for(tool(call.arguments, ctx), timeout)
        else:  # a sync tool cannot be interrupted; it runs inline
            output = await tool(call.arguments, ctx)
    except ToolTimeout as exc:
        return ToolResult(call, str(exc), False, timed_out=True)
    except TimeoutError:
        return ToolResult(
            call, f"error: {call.name} did not finish within {timeout:g} s and was stopped", False, timed_out=True
        )
    except ToolError as exc:
        return ToolResult(call, f"error: {exc}", False)
    except Exception as exc:  # the agent reads what went wrong; the episode goes on
        return ToolResult(call, f"error: {call.name} failed: {type(exc).__name__}: {exc}", False)
    return ToolResult(call, "" if output is None else str(output), True)
