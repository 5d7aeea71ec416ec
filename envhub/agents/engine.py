"""`EngineAgent`: an agent over an `InferenceEngine` (the embedded engine, vLLM or an SGLang server).

It formats the conversation with the rollout's own incremental chat-template code
(`envhub.chat_tokens.ChatTokens`), so a model is evaluated on exactly the token layout it is trained
on. Context window: when the conversation plus `max_new_tokens` would pass `max_total_tokens`, the
oldest turns after the first observation are dropped and the first observation gets the marker
"[N earlier turns were removed to fit the context window]"; the prompt is then re-tokenized once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from envhub.agents.base import Action, Agent, AgentError
from envhub.agents.chat import CONTEXT_MARKER

TURN_END_RESERVE = 8  # tokens kept free for the template's end of turn after a length-cut answer


class EngineAgent(Agent):
    """Generates each action with `engine.generate` on the chat-templated conversation."""

    name = "engine"

    def __init__(self, engine: Any, tokenizer: Any, sampling: Any = None, *, max_total_tokens: int = 4096) -> None:
        from envhub.chat_tokens import chat_stop_ids
        from envhub.inference import SamplingParams

        self.engine, self.tokenizer = engine, tokenizer
        self.stop_ids = chat_stop_ids(tokenizer)
        sampling = sampling or SamplingParams(max_new_tokens=256, temperature=0.0)
        self.sampling = dataclasses.replace(
            sampling, stop_token_ids=tuple(sorted(set(sampling.stop_token_ids) | self.stop_ids))
        )
        self.max_total_tokens = max_total_tokens
        self.reset({})

    def reset(self, info: dict[str, Any]) -> None:
        from envhub.chat_tokens import ChatTokens

        self.tools = info.get("tools") or None
        self.chat = ChatTokens(self.tokenizer, tools=self.tools)
        self.system_prompt = str(info.get("system_prompt") or "")
        self.seed = info.get("agent_seed")
        self.ids: list[int] = []
        self.turn = 0
        self.dropped_turns = 0

    async def act(self, observation: str, info: dict[str, Any]) -> Action:
        first = not self.chat.messages
        new = ([{"role": "system", "content": self.system_prompt}] if first and self.system_prompt else []) + [
            {"role": "user", "content": observation}
        ]
        self.ids += self.chat.add_messages(new)
        if len(self.ids) + self.sampling.max_new_tokens + TURN_END_RESERVE > self.max_total_tokens:
            self._truncate()
        sampling = self.sampling
        if sampling.temperature > 0 and self.seed is not None:
            sampling = dataclasses.replace(sampling, seed=(int(self.seed) * 1009 + self.turn) % 2**31)
        result = await self.engine.generate(list(self.ids), sampling)
        self.turn += 1
        self.ids += list(result.output_ids)
        content, closing = self.chat.add_assistant(list(result.output_ids), self.stop_ids)
        self.ids += closing
        return content

    def _truncate(self) -> None:
        """Drop the oldest (assistant, observation) pairs after the task until the prompt leaves room to answer."""
        messages = self.chat.messages
        head_len = 2 if messages and messages[0]["role"] == "system" else 1
        head, rest = messages[:head_len], messages[head_len:]
        room = self.max_total_tokens - self.sampling.max_new_tokens - TURN_END_RESERVE
        dropped = 0
        while True:
            marked = [dict(m) for m in head]
            if dropped:
                marked[-1]["content"] = f"{marked[-1]['content']}\n\n{CONTEXT_MARKER.format(n=dropped)}"
            kept = marked + rest[2 * dropped :]
            ids = self.chat.encode(self.chat.render(kept, generation_prompt=True))
            if len(ids) <= room:
                break
            if 2 * (dropped + 1) > len(rest) - 1:  # the newest observation must stay
                raise AgentError(
                    "context_length",
                    f"the task and the newest turn need {len(ids)} tokens, more than the {room} left for a prompt "
                    f"(max_total_tokens {self.max_total_tokens} - max_new_tokens {self.sampling.max_new_tokens} - "
                    f"{TURN_END_RESERVE})",
                    hint="raise max_total_tokens or lower max_new_tokens",
                )
            dropped += 1
        self.chat.messages = kept
        self.ids = ids
        self.dropped_turns = max(self.dropped_turns, dropped)
