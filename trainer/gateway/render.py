"""Chat messages to the exact prompt ids the model sees, and the model's output back to an assistant message.

The prompt is the model's own chat template over the harness's messages. Tools go to the template when it
renders them; a template that does not (SmolLM2's) gets them the way envhub's text agents write them: the schemas
in the system message, calls as `<tool_call>{json}</tool_call>` in the assistant's text, results as user turns.

An assistant message this episode's gateway produced, echoed back in a later request, is never re-tokenized:
the prompt is built segment by segment, the template text before the echoed turn tokenized, then the turn's
recorded output ids, then the template's closing of the turn (what the model did not write, e.g. the newline after
`<|im_end|>`). So a harness that appends to its history yields prompts that extend each other token for token.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from envhub.chat_tokens import chat_stop_ids
from envhub.trainer.gateway.episodes import Episode, message_key
from envhub.trainer.gateway.errors import RequestError

ROLES = {"system", "developer", "user", "assistant", "tool"}
TEXT_PARTS = {"text", "input_text", "output_text"}
MAX_MESSAGES = 4096  # a request's messages (or input items); far past any context window of the models served


@dataclass(frozen=True)
class Prompt:
    """A request's prompt ids and how its assistant messages were encoded."""

    ids: list[int]
    echoed: int  #: assistant turns spliced in as their recorded ids
    reencoded: int  #: assistant turns tokenized from their text


def _text(content: Any, where: str) -> str:
    """Message content (a string, null, or a list of text parts) as text; 400 for anything else."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            text_part = isinstance(part, dict) and part.get("type") in TEXT_PARTS
            if not text_part or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(400, f"{where}: only text content parts are supported, got {kind!r}", param=where)
            pieces.append(part["text"])
        return "".join(pieces)
    raise RequestError(400, f"{where}.content must be a string or a list of text parts", param=where)


def _calls(message: dict[str, Any], where: str) -> list[tuple[str, str, Any]]:
    """An assistant message's tool calls as (id, name, parsed arguments); 400 for malformed ones."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise RequestError(400, f"{where}.tool_calls must be a list", param=where)
    out = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(400, f"{where}.tool_calls[{index}] needs function.name", param=where)
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            arguments = raw  # kept as the harness sent it: it still renders, it just matches no recorded call
        out.append((str(call.get("id") or ""), function["name"], arguments))
    return out


@dataclass
class _Splice:
    """Where prompt building stands after a request's last spliced turn. An episode keeps the last one
    (`Episode.render_cache`) so that a harness that appends to its history costs a few template renders per call,
    not two per earlier turn."""

    messages: list[dict[str, Any]] = field(default_factory=list)  # rendered messages through the last spliced turn
    tools: Any = None
    covered: str = ""  # template text that `ids` stand for
    ids: list[int] = field(default_factory=list)
    echoed: int = 0
    reencoded: int = 0  # unmatched assistant turns among `messages`
    spliced: set[int] = field(default_factory=set)

    def copy(self) -> _Splice:
        return _Splice(
            list(self.messages),
            self.tools,
            self.covered,
            list(self.ids),
            self.echoed,
            self.reencoded,
            set(self.spliced),
        )

    @classmethod
    def resume(cls, episode: Episode | None, rendered: list[dict[str, Any]], tools: Any) -> _Splice:
        """The episode's cached state when this request's messages start with its messages, else a fresh one."""
        cached = episode.render_cache if episode is not None else None
        if (
            isinstance(cached, _Splice)
            and cached.tools == tools
            and rendered[: len(cached.messages)] == cached.messages
        ):
            return cached.copy()
        return cls(tools=tools)


class ChatRenderer:
    """Renders one model's chat template; tool-aware when the template is."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        template = str(getattr(tokenizer, "chat_template", "") or "")
        self.native_tools = "tools" in template and "tool_calls" in template
        self.stop_ids = chat_stop_ids(tokenizer)
        self.stop_texts = [tokenizer.decode([i], skip_special_tokens=False) for i in sorted(self.stop_ids)]
        self._lock = threading.RLock()  # prompts render in worker threads; a fast tokenizer is not re-entrant

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (its special tokens recognised, none added), as the rollout encodes."""
        with self._lock:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation: bool) -> str:
        if not messages:
            return ""
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools if self.native_tools else None, tokenize=False, add_generation_prompt=generation
            )
        except Exception as exc:  # a template error is the shape of the client's messages
            message = f"the model's chat template refused these messages: {exc}"
            raise RequestError(400, message, param="messages") from None

    def normalise(
        self, messages: Any, tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[tuple[str, list[str]] | None]]:
        """Messages the template renders, and for each assistant message its echo identity (message key, call ids)."""
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
        if len(messages) > MAX_MESSAGES:
            raise RequestError(
                400, f"{len(messages)} messages is over this gateway's limit of {MAX_MESSAGES}", param="messages"
            )
        rendered: list[dict[str, Any]] = []
        echoes: list[tuple[str, list[str]] | None] = []
        for index, message in enumerate(messages):
            where = f"messages[{index}]"
            if not isinstance(message, dict) or message.get("role") not in ROLES:
                raise RequestError(400, f"{where} needs a role among {sorted(ROLES)}", param=where)
            role, text = message["role"], _text(message.get("content"), where)
            role = "system" if role == "developer" else role
            echo = None
            if role == "assistant":
                calls = _calls(message, where)
                echo = (message_key(text, [(n, a) for _, n, a in calls]), [i for i, _, _ in calls if i])
                rendered.append(self._assistant(text, calls))
            elif role == "tool" and not self.native_tools:
                rendered.append({"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"})
            else:
                entry = {"role": role, "content": text}
                if role == "tool":
                    entry["tool_call_id"] = str(message.get("tool_call_id") or "")
                rendered.append(entry)
            echoes.append(echo)
        if tools and not self.native_tools:
            rendered = self._tools_in_system(rendered, tools)
            echoes = [None] * (len(rendered) - len(echoes)) + echoes
        return rendered, echoes

    def _assistant(self, text: str, calls: list[tuple[str, str, Any]]) -> dict[str, Any]:
        if not calls:
            return {"role": "assistant", "content": text}
        if self.native_tools:
            native = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]
            return {"role": "assistant", "content": text, "tool_calls": native}
        written = "".join(f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>" for _, n, a in calls)
        return {"role": "assistant", "content": text + written}

    @staticmethod
    def _tools_in_system(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        schemas = "\n".join(json.dumps(t.get("function", t)) for t in tools)
        block = (
            "# Tools\nYou may call these tools (JSON schemas):\n" + schemas + "\n"
            'Call one by writing <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> in your reply.'
        )
        if messages[0]["role"] == "system":
            return [{"role": "system", "content": messages[0]["content"] + "\n\n" + block}, *messages[1:]]
        return [{"role": "system", "content": block}, *messages]

    def prompt(self, messages: Any, tools: list[dict[str, Any]] | None, episode: Episode | None) -> Prompt:
        """The prompt ids of a chat request; assistant turns this episode produced keep their recorded ids."""
        with self._lock:
            return self._prompt(messages, tools, episode)

    def _prompt(self, messages: Any, tools: list[dict[str, Any]] | None, episode: Episode | None) -> Prompt:
        rendered, echoes = self.normalise(messages, tools)
        state = _Splice.resume(episode, rendered, tools)
        for index in range(len(state.messages), len(echoes)):
            echo = echoes[index]
            if echo is None:
                continue
            call = episode.find_echo(*echo) if episode is not None else None
            closing = None
            # each recorded call is spliced once per request: the template renders stay bounded by the episode's
            # calls, whatever a hostile history repeats
            if call is not None and call.index not in state.spliced:
                state.spliced.add(call.index)
                before = self._render(rendered[:index], tools, generation=True)
                through = self._render(rendered[: index + 1], tools, generation=False)
                if before.startswith(state.covered) and through.startswith(before):
                    closing = self._closing(through[len(before) :], call.output_ids)
            if closing is None:
                state.reencoded += 1
                continue
            state.ids += self.encode(before[len(state.covered) :]) + list(call.output_ids) + self.encode(closing)
            state.covered, state.echoed = through, state.echoed + 1
            state.messages = rendered[: index + 1]
        if episode is not None:
            episode.render_cache = state.copy()
        final = self._render(rendered, tools, generation=True)
        if not final.startswith(state.covered):  # the template re-renders earlier turns: nothing can be spliced
            return Prompt(self.encode(final), 0, state.echoed + state.reencoded)
        return Prompt(state.ids + self.encode(final[len(state.covered) :]), state.echoed, state.reencoded)

    def _closing(self, turn: str, output_ids: list[int]) -> str | None:
        """Template text after the model's own tokens in its rendered `turn` (None when the turn has no
        end-of-turn marker to align on)."""
        written = self.tokenizer.decode(output_ids, skip_special_tokens=False)
        if turn.startswith(written):
            return turn[len(written) :]
        ends = [(turn.rfind(s), s) for s in self.stop_texts if s and s in turn]
        if not ends:
            return None
        at, stop = max(ends)
        stopped = bool(output_ids) and output_ids[-1] in self.stop_ids
        return turn[at + len(stop) :] if stopped else turn[at:]

    def reply(self, output_ids: list[int], tools_offered: bool) -> dict[str, Any]:
        """The assistant message for the model's output: text, and tool calls when the request offered tools."""
        body = output_ids[:-1] if output_ids and output_ids[-1] in self.stop_ids else output_ids
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        from envhub.trainer.engines.server.openai_api import chat_message

        return chat_message(text, tools_offered)[0]  # the engine server's own parsing: one tool-call format
