"""Incremental chat-template tokenization: a conversation's token ids only ever grow, turn by turn.

Shared by the trainer's rollouts and `envhub.agents.EngineAgent`, so a model is evaluated on exactly the
token layout it is trained on. Template deltas are computed as text: render the conversation with and
without the new messages and tokenize only the suffix. When a template re-renders earlier turns (the longer
render does not start with the shorter one, as templates that strip old reasoning do), the delta is rendered
after a fixed anchor instead: template([system, *new]) minus template([system]). Earlier ids are never
re-tokenized, so they cannot change.
"""

from __future__ import annotations

from typing import Any


class ChatTokens:
    """Incremental chat-template tokenization of one conversation."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.messages: list[dict[str, str]] = []
        self.template_fallbacks = 0

    def render(self, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
        """The template's text for `messages`."""
        if not messages:
            return ""
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (special tokens in it are recognised, none added)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def delta(self, new: list[dict[str, str]], generation_prompt: bool) -> str:
        """Template text that `new` messages add after the conversation so far."""
        before = self.render(self.messages, generation_prompt=False)
        after = self.render(self.messages + new, generation_prompt=generation_prompt)
        if after.startswith(before):
            return after[len(before) :]
        self.template_fallbacks += 1
        anchor = self.messages[:1] if self.messages and self.messages[0]["role"] == "system" else []
        base = self.render(anchor, generation_prompt=False)
        return self.render(anchor + new, generation_prompt=generation_prompt)[len(base) :]

    def add_messages(self, new: list[dict[str, str]]) -> list[int]:
        """Append env/user messages plus the assistant generation prompt; returns their ids."""
        ids = self.encode(self.delta(new, generation_prompt=True))
        self.messages.extend(new)
        return ids

    def add_assistant(self, output_ids: list[int], stop_ids: set[int]) -> tuple[str, list[int]]:
        """Record the model's turn; returns its text and the ids of the turn's closing the model did not write."""
        body = output_ids[:-1] if output_ids and output_ids[-1] in stop_ids else output_ids
        content = self.tokenizer.decode(body, skip_special_tokens=True)
        written = self.tokenizer.decode(output_ids, skip_special_tokens=False)
        message = {"role": "assistant", "content": content}
        rendered = self.render(self.messages + [message])[len(self.render(self.messages, generation_prompt=True)) :]
        self.messages.append(message)
        if rendered.startswith(written):
            return content, self.encode(rendered[len(written) :])
        # the model's text is not how the template spells it (e.g. stray special tokens): close the
        # turn with the template's own ending after the content.
        tail = rendered[len(content) :] if rendered.startswith(content) else rendered
        if output_ids and output_ids[-1] in stop_ids:
            eos_text = self.tokenizer.decode(output_ids[-1:], skip_special_tokens=False)
            tail = tail[len(eos_text) :] if tail.startswith(eos_text) else tail
        return content, self.encode(tail)


def chat_stop_ids(tokenizer: Any) -> set[int]:
    """Token ids that end a model's turn: EOS and the ChatML end-of-turn token when the vocabulary has it."""
    return {
        i
        for i in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))
        if isinstance(i, int) and i >= 0
    }
