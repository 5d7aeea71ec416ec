"""The SGLang protocol as envhub speaks it, in one place for the client, the compatible server and routers: /generate
JSON on the wire (request parsing with SGLang's 400s, responses with weight spans), which episode a request belongs
to, and how a weight push's buckets are spelled.

Checked against SGLang 0.5.23 (`sglang.api.v1.api_types`, `sglang.srt.sampling.sampling_params`,
`tokenizer_manager`): `sampling_params` rejects unknown keys and values out of range, `text` and `input_ids`
are exclusive, prompts must fit the context. Versions are strings ("default" until an update names one) and
`meta_info.weight_versions` lists `{version, start, end}` spans over the output tokens.

Episodes: the rollout sets `episode_key` once per episode task; `MultiEngine` routes on it, and `SGLangEngine` sends
it to sglang-router as the `X-SMG-Routing-Key` header (its `manual` policy pins a key to one worker).

Weight pushes: the fields of each bucket request, the tensors' device for CUDA IPC, and the process group of a
distributed push (the trainer's rank 0 and every server's ranks).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from envhub.errors import EngineError
from envhub.inference import GenerateResult, SamplingParams

_TOP_K_ALL = 1 << 30
episode_key: ContextVar[str | None] = ContextVar("envhub_episode_key", default=None)
ROUTING_HEADER = "X-SMG-Routing-Key"
# Routes SGLang marks ADMIN_OPTIONAL (those envhub uses): with --admin-api-key they need that key and refuse
# --api-key; without it, --api-key.
ADMIN_ROUTES = frozenset(
    {
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/update_weights_from_distributed",
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/begin_weight_update",
        "/end_weight_update",
        "/update_weight_version",
        "/pause_generation",
        "/continue_generation",
        "/abort_request",
        "/flush_cache",
        "/release_memory_occupation",
        "/resume_memory_occupation",
    }
)
# SGLang's sampling_params keys; those envhub does not implement are accepted only at their neutral value.
_UNSUPPORTED_NEUTRAL: dict[str, Any] = {
    "stop_regex": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "custom_params": None,
    "beam_width": None,
    "watermark": None,
    "choice": [],
    "stream_interval": None,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
}
_KEYS = {
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "ignore_eos",
    "logit_bias",
    "sampling_seed",
} | set(_UNSUPPORTED_NEUTRAL)


@dataclass(frozen=True)
class GenerateCall:
    """One prompt of a /generate request, validated."""

    input_ids: list[int]
    sampling: SamplingParams
    rid: str | None
    n: int = 1


def _number(params: dict[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EngineError(f"sampling_params.{key} must be a number, got {value!r}")
    return float(value)


def _integer(params: dict[str, Any], key: str, default: int | None) -> int | None:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineError(f"sampling_params.{key} must be an integer, got {value!r}")
    return value


def parse_sampling(params: Any, vocab_size: int) -> tuple[SamplingParams, int]:
    """SGLang `sampling_params` JSON as (SamplingParams, n); EngineError (400) where SGLang refuses it."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise EngineError("sampling_params must be a JSON object")
    unknown = sorted(set(params) - _KEYS)
    if unknown:
        raise EngineError(f"unknown sampling_params field {unknown[0]!r}", hint="see SGLang's sampling_params")
    for key, neutral in _UNSUPPORTED_NEUTRAL.items():
        if params.get(key, neutral) not in (neutral, None):
            raise EngineError(f"sampling_params.{key} is not supported by envhub serve-engine")
    temperature = _number(params, "temperature", 1.0)
    top_p, min_p = _number(params, "top_p", 1.0), _number(params, "min_p", 0.0)
    top_k = _integer(params, "top_k", -1)
    frequency, presence = _number(params, "frequency_penalty", 0.0), _number(params, "presence_penalty", 0.0)
    repetition = _number(params, "repetition_penalty", 1.0)
    max_new = _integer(params, "max_new_tokens", 128)
    min_new = _integer(params, "min_new_tokens", 0)
    n = _integer(params, "n", 1)
    seed = _integer(params, "sampling_seed", None)
    checks = [
        (
            math.isfinite(temperature) and temperature >= 0,
            f"temperature must be a non-negative finite number, got {temperature}",
        ),
        (0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}"),
        (0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {min_p}"),
        (top_k == -1 or top_k >= 1, f"top_k must be -1 (disable) or at least 1, got {top_k}"),
        (-2.0 <= frequency <= 2.0, f"frequency_penalty must be in [-2, 2], got {frequency}"),
        (-2.0 <= presence <= 2.0, f"presence_penalty must be in [-2, 2], got {presence}"),
        (0.0 < repetition <= 2.0, f"repetition_penalty must be in (0, 2], got {repetition}"),
        (max_new >= 0, f"max_new_tokens must be at least 0, got {max_new}"),
        (0 <= min_new <= max_new, f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}"),
        (1 <= n <= 64, f"n must be in [1, 64], got {n}"),
        (seed is None or -(2**63) <= seed < 2**63, f"sampling_seed must be a 64-bit integer, got {seed}"),
    ]
    for ok, message in checks:
        if not ok:
            raise EngineError(message)
    stop = params.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise EngineError("sampling_params.stop must be a string or a list of strings")
    stop_ids = params.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise EngineError("sampling_params.stop_token_ids must be a list of integers")
    bias = params.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise EngineError("sampling_params.logit_bias must be an object {token_id: bias}")
    try:
        pairs = tuple((int(k), float(v)) for k, v in bias.items())
    except (TypeError, ValueError) as exc:
        raise EngineError(f"sampling_params.logit_bias: {exc}") from exc
    if any(not 0 <= token < vocab_size for token, _ in pairs):
        raise EngineError(f"logit_bias must have keys in [0, {vocab_size - 1}]")
    ignore_eos = params.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise EngineError("sampling_params.ignore_eos must be a boolean")
    sampling = SamplingParams(
        max_new_tokens=max_new,
        temperature=temperature,
        top_p=top_p,
        top_k=-1 if top_k >= _TOP_K_ALL else top_k,
        stop_token_ids=tuple(stop_ids),
        stop=tuple(stop),
        seed=seed,
        min_p=min_p,
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
        min_new_tokens=min_new,
        ignore_eos=ignore_eos,
        logit_bias=pairs,
    )
    return sampling, n


def _token_list(value: Any, vocab_size: int) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise EngineError("input_ids must be a list of token ids or a list of such lists")
    bad = [t for t in value if not 0 <= t < vocab_size]
    if bad:
        raise EngineError(f"input_ids contain ids outside [0, {vocab_size}): {bad[:5]}")
    return value


def parse_generate(
    body: dict[str, Any], tokenizer: Any, vocab_size: int, context_len: int
) -> tuple[list[GenerateCall], bool]:
    """A /generate body as its prompts (one, or a batch) and whether it was a batch; EngineError -> 400."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is not None and input_ids is not None:
        raise EngineError("text and input_ids cannot be provided at the same time")
    if text is None and input_ids is None:
        raise EngineError("either text or input_ids should be provided")
    if not isinstance(body.get("stream", False), bool):
        raise EngineError("stream must be a boolean")
    if text is not None:
        if tokenizer is None:
            raise EngineError("this server has no tokenizer; send input_ids")
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise EngineError("text must be a string or a non-empty list of strings")
        prompts = [tokenizer.encode(t) for t in texts]
        batch = not isinstance(text, str)
    else:
        batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        prompts = [_token_list(p, vocab_size) for p in (input_ids if batch else [input_ids])]
        if not prompts:
            raise EngineError("input_ids is an empty batch")
    rids = body.get("rid")
    if batch:
        rids = rids if rids is not None else [None] * len(prompts)
        if (
            not isinstance(rids, list)
            or len(rids) != len(prompts)
            or not all(r is None or isinstance(r, str) for r in rids)
        ):
            raise EngineError("rid must be a list of strings, one per prompt")
    else:
        if rids is not None and not isinstance(rids, str):
            raise EngineError("rid must be a string")
        rids = [rids]
    params = body.get("sampling_params")
    params = params if isinstance(params, list) else [params] * len(prompts)
    if len(params) != len(prompts):
        raise EngineError("sampling_params must be one object or a list with one per prompt")
    calls = []
    for ids, rid, p in zip(prompts, rids, params):
        sampling, n = parse_sampling(p, vocab_size)
        if not ids:
            raise EngineError("the prompt is empty")
        if len(ids) >= context_len:
            raise EngineError(
                f"The input ({len(ids)} tokens) is longer than the model's context length ({context_len} tokens)."
            )
        if len(ids) + sampling.max_new_tokens > context_len:
            raise EngineError(
                f"Requested token count exceeds the model's maximum context length of {context_len} tokens: "
                f"{len(ids)} input + {sampling.max_new_tokens} max_new_tokens"
            )
        calls.append(GenerateCall(ids, sampling, rid, n))
    return calls, batch


def weight_spans(token_versions: list[int], labels: dict[int, str], current: str) -> list[dict[str, Any]]:
    """Per-token engine versions as SGLang's `weight_versions` spans [{version, start, end}] (end exclusive)."""
    spans: list[dict[str, Any]] = []
    for index, number in enumerate(token_versions):
        label = labels.get(number, str(number))  # versions set on the engine directly (in-process pushes)
        if spans and spans[-1]["version"] == label:
            spans[-1]["end"] = index + 1
        else:
            spans.append({"version": label, "start": index, "end": index + 1})
    return spans or [{"version": current, "start": 0, "end": 0}]


def generate_response(
    result: GenerateResult, text: str, return_logprob: bool, spans: list[dict[str, Any]]
) -> dict[str, Any]:
    """A GenerateResult as SGLang's /generate response object."""
    finish: dict[str, Any] = {"type": result.finish_reason}
    if result.finish_reason == "length":
        finish["length"] = len(result.output_ids)
    elif result.finish_reason == "stop" and result.output_ids:
        finish["matched"] = result.output_ids[-1]
    elif result.finish_reason == "abort":
        finish["message"] = "Abort before prefill" if not result.output_ids else "aborted"
    meta: dict[str, Any] = {
        "id": result.meta.get("rid") or "",
        "finish_reason": finish,
        "prompt_tokens": result.meta.get("prompt_tokens", 0),
        "completion_tokens": len(result.output_ids),
        "cached_tokens": 0,
        "weight_version": spans[-1]["version"],
        "weight_versions": spans,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(result.logprobs, result.output_ids)]
    return {"text": text, "output_ids": list(result.output_ids), "meta_info": meta}


# Weight pushes to SGLang servers


def bucket_fields(count: int, version: int | None, flush: bool, abort_all: bool) -> Iterator[dict[str, Any]]:
    """The update fields of each of `count` bucket requests: only the first aborts, only the last flushes and
    names the version (SGLang records a version change only when an update names a new one)."""
    for index in range(count):
        last = index == count - 1
        fields: dict[str, Any] = {"flush_cache": flush and last, "abort_all_requests": abort_all and index == 0}
        if last and version is not None:
            fields["weight_version"] = str(version)
        yield fields


def send_buckets(group: Any, buckets: Sequence[Any], flattened: bool) -> None:
    """Rank 0's side of a distributed update: broadcast each bucket in order."""
    for bucket in buckets:
        group.send(bucket, flattened)


def on_cuda(bucket: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The bucket's tensors on a CUDA device (SGLang opens them as CUDA IPC handles)."""
    import torch

    if all(t.is_cuda for _, t in bucket):
        return bucket
    if not torch.cuda.is_available():
        raise EngineError(
            "tensor_format sglang sends CUDA IPC handles, but the weights are on CPU and there is no GPU here",
            hint="use engine.weight_sync: disk (or tensor_format: safetensors for envhub serve-engine)",
        )
    return [(name, t.to("cuda", non_blocking=True)) for name, t in bucket]


async def join_weight_group(
    engines: Sequence[Any],
    master_address: str,
    master_port: int,
    backend: str,
    device: Any,
    group_name: str = "weight_update_group",
    timeout_s: float = 600.0,
) -> Any:
    """Form one process group: the trainer is rank 0, server i holds ranks 1 + sum(tp of servers before it) ...
    (world size 1 + every server's tp_size). Returns the trainer's weight_sync.WeightGroup."""
    from envhub.trainer.engines.weight_sync import WeightGroup

    offsets, world = [], 1
    for engine in engines:
        offsets.append(world)
        world += engine.tp_size
    trainer = asyncio.to_thread(
        WeightGroup.join, master_address, master_port, 0, world, backend, device, group_name, timeout_s
    )
    servers = [
        e.init_weights_update_group(master_address, master_port, offset, world, backend, group_name)
        for e, offset in zip(engines, offsets)
    ]
    results = await asyncio.gather(trainer, *servers)
    return results[0]
