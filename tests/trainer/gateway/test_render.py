"""Rendering with a template that speaks tools (envhub's Hermes template, as vLLM serves the tiny model): tool
calls go to the template natively, and an echoed turn keeps its recorded ids, so the next prompt extends the last."""

from __future__ import annotations

import copy
import json

from envhub.trainer.engines.vllm.command import HERMES_TEMPLATE
from envhub.trainer.gateway.episodes import EpisodeBook, RecordedCall
from envhub.trainer.gateway.render import ChatRenderer
from tests.trainer.gateway.conftest import CALL, CHAT_TOOLS, FIRST_MESSAGES


def test_native_tool_template_splices_echoed_turns(tokenizer):
    hermes = copy.copy(tokenizer)
    hermes.chat_template = HERMES_TEMPLATE.read_text()
    renderer = ChatRenderer(hermes)
    assert renderer.native_tools and not ChatRenderer(tokenizer).native_tools
    book = EpisodeBook()
    episode, _ = book.open(100)
    first = renderer.prompt(FIRST_MESSAGES, CHAT_TOOLS, episode)
    assert '"name": "add"' in hermes.decode(first.ids)  # the template wrote the schema itself
    # "call" as two tokens "c" "all": the text a tokenizer would spell otherwise, so only a splice keeps these ids
    canonical = renderer.encode(CALL)
    output = canonical[:-2] + [hermes.convert_tokens_to_ids("c"), hermes.convert_tokens_to_ids("all"), canonical[-1], 2]
    assert hermes.decode(output[:-1]) == CALL and renderer.encode(CALL) != output[:-1]
    book.reserve(episode, 10)
    call = RecordedCall(
        0, "chat", first.ids, output, [-0.5] * len(output), [0] * len(output), "stop", renderer.reply(output, True)
    )
    book.record(episode, call, 10)
    [tool_call] = call.message["tool_calls"]
    assert json.loads(tool_call["function"]["arguments"]) == {"a": 2, "b": 3}
    history = [*FIRST_MESSAGES, call.message, {"role": "tool", "tool_call_id": tool_call["id"], "content": "5"}]
    second = renderer.prompt(history, CHAT_TOOLS, episode)
    assert (second.echoed, second.reencoded) == (1, 0)
    assert second.ids[: len(first.ids) + len(output)] == first.ids + output
    book.reserve(episode, 10)
    answer = RecordedCall(1, "chat", second.ids, [330, 2], [-0.1, -0.2], [0, 0], "stop", renderer.reply([330, 2], True))
    book.record(episode, answer, 10)
    longer = [*history, answer.message, {"role": "user", "content": "Thanks."}]
    cached = renderer.prompt(longer, CHAT_TOOLS, episode)  # resumes after the turn spliced last time
    episode.render_cache = None
    assert cached == renderer.prompt(longer, CHAT_TOOLS, episode) and cached.echoed == 2
    assert cached.ids[: len(second.ids) + 2] == second.ids + [330, 2]
    stranger = {
        **call.message,
        "tool_calls": [{**tool_call, "id": "call_other", "function": {"name": "add", "arguments": '{"a": 4, "b": 3}'}}],
    }  # a turn the gateway did not produce
    third = renderer.prompt([*FIRST_MESSAGES, stranger], CHAT_TOOLS, episode)
    assert (third.echoed, third.reencoded) == (0, 1)
