"""The shared tool-call parser: every accepted form, and readable errors for every bad one."""

import json

import pytest

from envhub import parse_tool_calls, tool
from envhub.toolcalls import run_tool_call
from envhub.tools import ALL_TOOLS, ToolContext


@tool
def move(direction: str, steps: int = 1) -> str:
    """Move the player.

    Args:
        direction: One of up, down, left, right.
        steps: How many cells to move.
    """
    return f"moved {direction} x{steps}"


TOOLS = [move]


def test_hermes_tagged_call_with_prose_around_it():
    parsed = parse_tool_calls(
        'I will go up.\n<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>', TOOLS
    )
    assert parsed.ok and parsed.text == "I will go up."
    assert [(c.name, c.arguments) for c in parsed.calls] == [("move", {"direction": "up"})]


def test_several_tagged_calls_keep_their_order():
    text = "".join(
        f'<tool_call>{{"name": "move", "arguments": {{"direction": "{d}"}}}}</tool_call>' for d in ("up", "left")
    )
    assert [c.arguments["direction"] for c in parse_tool_calls(text, TOOLS).calls] == ["up", "left"]


@pytest.mark.parametrize(
    "action",
    [
        '{"name": "move", "arguments": {"direction": "down"}}',
        'Sure:\n```json\n{"name": "move", "parameters": {"direction": "down"}}\n```',
        '{"name": "move", "arguments": "{\\"direction\\": \\"down\\"}"}',
        {"name": "move", "arguments": {"direction": "down"}},
        {"type": "function", "function": {"name": "move", "arguments": '{"direction": "down"}'}},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "function": {"name": "move", "arguments": {"direction": "down"}}}],
        },
    ],
)
def test_json_and_dict_forms(action):
    parsed = parse_tool_calls(action, TOOLS)
    assert parsed.ok, parsed.errors
    assert parsed.calls[0].name == "move" and parsed.calls[0].arguments == {"direction": "down"}


def test_plain_text_is_not_a_call():
    parsed = parse_tool_calls("I think the answer is {probably} 4", TOOLS)
    assert parsed.ok and parsed.calls == () and "answer is" in parsed.text


@pytest.mark.parametrize(
    "action, expected",
    [
        ('<tool_call>{"name": "move", "arguments": {"direction": </tool_call>', "not valid JSON"),
        ("<tool_call></tool_call>", "is empty"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "fly", "arguments": {}}</tool_call>', "unknown tool 'fly'; available tools: move"),
        ('<tool_call>{"name": "move", "arguments": {}}</tool_call>', "missing required argument(s) direction"),
        (
            '<tool_call>{"name": "move", "arguments": {"direction": "up", "speed": 3}}</tool_call>',
            "unexpected argument(s) speed",
        ),
        (
            '<tool_call>{"name": "move", "arguments": {"direction": "up", "steps": "many"}}</tool_call>',
            "should be integer",
        ),
        ('<tool_call>["move"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "move", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ],
)
def test_malformed_calls_become_readable_errors(action, expected):
    parsed = parse_tool_calls(action, TOOLS)
    assert not parsed.ok
    message = parsed.error_message()
    assert expected in message and message.startswith("Your action could not be executed")


def test_a_value_outside_an_enum_names_the_allowed_values():
    from typing import Literal

    @tool
    def turn(side: Literal["left", "right"]) -> str:
        """Turn."""
        return side

    parsed = parse_tool_calls('{"name": "turn", "arguments": {"side": "sideways"}}', [turn])
    assert "argument 'side' should be one of left, right, got \"sideways\"" in parsed.error_message()


def test_unclosed_tag_at_the_end_is_still_parsed():
    parsed = parse_tool_calls('<tool_call>{"name": "move", "arguments": {"direction": "up"}}', TOOLS)
    assert parsed.ok and parsed.calls[0].arguments == {"direction": "up"}


def test_string_numbers_are_coerced_to_the_schema_type():
    parsed = parse_tool_calls(
        '<tool_call>{"name": "move", "arguments": {"direction": "up", "steps": "3"}}</tool_call>', TOOLS
    )
    assert parsed.calls[0].arguments["steps"] == 3


def test_non_utf8_bytes_and_huge_actions_are_reported_not_raised():
    parsed = parse_tool_calls(b"go \xff\xfe up", TOOLS)
    assert "not valid UTF-8" in parsed.error_message() and "go" in parsed.text
    huge = parse_tool_calls("x" * 300_000, TOOLS)
    assert not huge.ok and "limit" in huge.error_message()


def test_schema_comes_from_signature_and_docstring():
    fn = move.schema["function"]
    assert fn["name"] == "move" and fn["description"] == "Move the player."
    assert fn["parameters"] == {
        "type": "object",
        "properties": {
            "direction": {"type": "string", "description": "One of up, down, left, right."},
            "steps": {"type": "integer", "description": "How many cells to move.", "default": 1},
        },
        "required": ["direction"],
    }
    json.dumps([t.schema for t in ALL_TOOLS.values()])  # every shared tool schema is JSON


def test_ctx_parameter_is_injected_and_hidden_from_the_schema():
    assert "ctx" not in ALL_TOOLS["bash"].parameters["properties"]
    assert ALL_TOOLS["bash"].parameters["required"] == ["command"]


async def test_tool_failures_become_observations():
    parsed = parse_tool_calls(
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', ALL_TOOLS.values()
    )
    result = await run_tool_call(parsed.calls[0], ALL_TOOLS.values(), ToolContext(sandbox=None))
    assert not result.ok and "needs a sandbox" in result.output
    ok = await run_tool_call(
        parse_tool_calls('{"name": "move", "arguments": {"direction": "up", "steps": 2}}', TOOLS).calls[0], TOOLS
    )
    assert ok.ok and ok.output == "moved up x2"
