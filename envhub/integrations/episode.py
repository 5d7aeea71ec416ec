"""One envhub episode as token ids, for trainers that own generation (verl's agent loop, TRL's rollout_func).

The layout is the one envhub's own trainer uses (`envhub.chat_tokens.ChatTokens`): the prompt is the template of
[system prompt, first observation] with the env's tools; the response is every later token, the model's (mask 1)
and the template's and env's (mask 0: the end of a model turn, each observation turn), ending with the model's
last token. Ids never change once emitted, so the response can be scored token by token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from envhub.chat_tokens import ChatTokens, chat_stop_ids
from envhub.registry import as_async

#: (all ids so far, most new tokens) -> (new ids, their logprobs or None)
Generate = Callable[[list[int], int], Awaitable[tuple[list[int], list[float] | None]]]


@dataclass
class TokenEpisode:
    """A finished episode: prompt, response, per-token loss mask and logprobs, per-turn rewards."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1: the model's token, 0: template or env
    logprobs: list[float] | None = field(default_factory=list)  # 0.0 for env tokens; None if generate gave none
    turn_rewards: list[float] = field(default_factory=list)
    turns: int = 0
    finish_reason: str = ""  # terminated | truncated | max_turns | max_tokens
    info: dict[str, Any] = field(default_factory=dict)  # the last step's info (reset's before any step)

    @property
    def reward(self) -> float:
        """The episode's return."""
        return float(sum(self.turn_rewards))

    @property
    def terminated(self) -> bool:
        return self.finish_reason == "terminated"

    def add(self, ids: list[int], model: bool, logprobs: list[float] | None = None) -> None:
        """Append response tokens: the model's (with their logprobs, if the generator gave any) or not."""
        self.response_ids += ids
        self.response_mask += [int(model)] * len(ids)
        if model and logprobs is None:
            self.logprobs = None  # one turn without logprobs: the episode has none
        elif self.logprobs is not None:
            self.logprobs += list(logprobs) if model else [0.0] * len(ids)


def first_messages(info: dict[str, Any], observation: str, prompt: list[dict[str, Any]] | None = None) -> list[dict]:
    """The conversation's opening: the dataset's own messages (if any), the env's system prompt unless one is there,
    then the first observation as a user turn."""
    messages = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in (prompt or [])]
    messages = [m for m in messages if m["content"] or m["role"] == "system"]
    if info.get("system_prompt") and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": info["system_prompt"]})
    return [*messages, {"role": "user", "content": observation}]


async def play_episode(
    env: Any,
    tokenizer: Any,
    generate: Generate,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    prompt: list[dict[str, Any]] | None = None,
    max_turns: int = 8,
    max_response_tokens: int = 1024,
    max_new_tokens: int | None = None,
) -> TokenEpisode:
    """Play `env` to its end with `generate`, within `max_turns` model turns and `max_response_tokens`."""
    env = as_async(env)  # its own gymnasium wrappers, if any, run on the async path too
    obs, info = await env.areset(seed=seed, options=options)
    chat = ChatTokens(tokenizer, tools=info.get("tools"))
    stop_ids = chat_stop_ids(tokenizer)
    episode = TokenEpisode(prompt_ids=chat.add_messages(first_messages(info, obs, prompt)), info=dict(info))
    while True:
        budget = max_response_tokens - len(episode.response_ids)
        if budget <= 0:
            episode.finish_reason = "max_tokens"
            break
        request = min(max_new_tokens or budget, budget)
        output_ids, logprobs = await generate(episode.prompt_ids + episode.response_ids, request)
        output_ids = list(output_ids)[:budget]
        episode.add(output_ids, model=True, logprobs=None if logprobs is None else list(logprobs)[: len(output_ids)])
        episode.turns += 1
        action, closing = chat.add_assistant(output_ids, stop_ids)
        obs, reward, terminated, truncated, episode.info = await env.astep(action)
        episode.turn_rewards.append(float(reward))
        if terminated or truncated:
            episode.finish_reason = "terminated" if terminated else "truncated"
            break  # the response ends with the model's last token
        if episode.turns >= max_turns:
            episode.finish_reason = "max_turns"
            break
        episode.add(closing + chat.add_messages([{"role": "user", "content": obs}]), model=False)
    cut = max_response_tokens
    episode.response_ids, episode.response_mask = episode.response_ids[:cut], episode.response_mask[:cut]
    if episode.logprobs is not None:
        episode.logprobs = episode.logprobs[:cut]
    return episode
