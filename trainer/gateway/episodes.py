"""Per-episode records of the gateway: which API key belongs to which episode, and every model call it made.

`EpisodeBook` is the one writer of this state: it opens episodes (a fresh random key each), finds the episode of a
request's key, appends each finished call and closes episodes. Keys are looked up by their SHA-256 digest, so the
lookup's timing says nothing about a key's characters.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

KEY_PREFIX = "envhub-ep-"


@dataclass(frozen=True)
class EpisodeHandle:
    """What a harness needs to reach its episode: OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL."""

    episode_id: str
    base_url: str
    api_key: str
    model: str
    mcp: bool = False  #: the episode's env tools are served at ENVHUB_MCP_URL

    def env(self) -> dict[str, str]:
        """The environment variables every OpenAI-compatible client reads (plus ENVHUB_MCP_URL with tools)."""
        env = {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "OPENAI_MODEL": self.model}
        if self.mcp:
            env["ENVHUB_MCP_URL"] = mcp_url(self.base_url)
        return env


def mcp_url(base_url: str) -> str:
    """The MCP endpoint beside an OpenAI base URL (`http://host:port/v1` -> `http://host:port/mcp`)."""
    return base_url.removesuffix("/").removesuffix("/v1") + "/mcp"


@dataclass(frozen=True)
class RecordedCall:
    """One model call as the engine served it: the exact prompt ids, the sampled ids with their logprobs and
    policy versions, and the assistant message the harness received (for matching its echo later)."""

    index: int
    route: str
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    message: dict[str, Any]
    echoed: int = 0  #: assistant messages in the prompt encoded with their recorded ids
    reencoded: int = 0  #: assistant messages in the prompt tokenized from text (not produced here, or no match)
    duration_s: float = 0.0

    def as_record(self) -> dict[str, Any]:
        """A JSON-ready dict (for episodes.jsonl)."""
        return {
            "index": self.index,
            "route": self.route,
            "prompt_ids": self.prompt_ids,
            "output_ids": self.output_ids,
            "logprobs": self.logprobs,
            "versions": self.versions,
            "finish_reason": self.finish_reason,
            "echoed": self.echoed,
            "reencoded": self.reencoded,
            "duration_s": round(self.duration_s, 4),
        }


def message_key(content: Any, calls: list[tuple[str, Any]]) -> str:
    """The identity of an assistant message for echo matching: its stripped text and its calls (name, parsed
    arguments), canonical JSON, so a harness that re-serialises arguments or trims whitespace still matches."""
    return json.dumps([str(content or "").strip(), [[name, args] for name, args in calls]], sort_keys=True)


@dataclass
class Episode:
    """One open episode: its key's digest, token budget and recorded calls."""

    episode_id: str
    digest: bytes
    token_budget: int
    calls: list[RecordedCall] = field(default_factory=list)
    by_message: dict[str, RecordedCall] = field(default_factory=dict)  # message_key -> latest call producing it
    by_call_id: dict[str, RecordedCall] = field(default_factory=dict)  # tool call id -> the call that made it
    tokens_used: int = 0  # sampled tokens so far
    reserved: int = 0  # max_new_tokens of calls in flight
    started: int = 0  # calls begun (a call's index is its order of arrival)
    closed: bool = False
    tools: Any = None  # the episode's EpisodeTools served at /mcp (gateway.mcp), or None
    sampling_key: str | None = None  # when set, call i samples with the seed sampling_seed(sampling_key, i)
    render_cache: Any = None  # written by ChatRenderer only: its prompt state after the last spliced turn
    opened_at: float = field(default_factory=time.monotonic)

    @property
    def tokens_left(self) -> int:
        """Sampled tokens this episode may still ask for (calls in flight hold their maximum)."""
        return max(0, self.token_budget - self.tokens_used - self.reserved)

    def find_echo(self, key: str, call_ids: list[str]) -> RecordedCall | None:
        """The recorded call whose output a request's assistant message echoes (tool call ids first)."""
        for call_id in call_ids:
            if call_id in self.by_call_id:
                return self.by_call_id[call_id]
        return self.by_message.get(key)


#: where the trust middleware leaves a request's episode for its route
EPISODE: Any = web.RequestKey("episode", Episode) if hasattr(web, "RequestKey") else "episode"


class EpisodeBook:
    """Open episodes by key; the only code that writes them."""

    def __init__(self) -> None:
        self._episodes: dict[bytes, Episode] = {}

    @staticmethod
    def _digest(key: str) -> bytes:
        return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()

    def open(self, token_budget: int, tools: Any = None, sampling_key: str | None = None) -> tuple[Episode, str]:
        """A new episode with a fresh random API key (returned once, stored only as its digest)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        episode = Episode(
            uuid.uuid4().hex[:16], self._digest(key), token_budget, tools=tools, sampling_key=sampling_key
        )
        self._episodes[episode.digest] = episode
        return episode, key

    def lookup(self, key: str) -> Episode | None:
        """The open episode of `key`, or None (unknown or closed)."""
        return self._episodes.get(self._digest(key))

    def get(self, episode_id: str) -> Episode:
        """The open episode with this id; KeyError when it is not open."""
        for episode in self._episodes.values():
            if episode.episode_id == episode_id:
                return episode
        raise KeyError(f"episode {episode_id} is not open at this gateway")

    def reserve(self, episode: Episode, max_new_tokens: int) -> int:
        """Hold `max_new_tokens` of the episode's budget for a call about to run; returns the call's index."""
        episode.reserved += max_new_tokens
        episode.started += 1
        return episode.started - 1

    def record(self, episode: Episode, call: RecordedCall, reserved: int) -> None:
        """Append a finished call and index its assistant message for echo matching."""
        episode.reserved -= reserved
        episode.tokens_used += len(call.output_ids)
        if episode.closed:
            return  # the episode ended while the call ran: its record is already handed over
        episode.calls.append(call)
        calls = call.message.get("tool_calls") or []
        parsed = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        episode.by_message[message_key(call.message.get("content"), parsed)] = call
        for c in calls:
            episode.by_call_id[c["id"]] = call

    def release(self, episode: Episode, reserved: int) -> None:
        """Give back a reservation of a call that failed."""
        episode.reserved -= reserved

    def close(self, episode: Episode) -> list[RecordedCall]:
        """End the episode (its key answers 401 from now on) and return its calls in order."""
        episode.closed = True
        self._episodes.pop(episode.digest, None)
        return list(episode.calls)

    def __len__(self) -> int:
        return len(self._episodes)
