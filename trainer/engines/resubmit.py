"""Generation that survives weight pushes: a request aborted by a pause is resubmitted where it stopped.

Both HTTP engine clients (SGLang's and vLLM's) generate this way; each supplies one `submit` call to its server.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace

from envhub.inference import FinishReason, GenerateResult, SamplingParams

Submit = Callable[[str, list[int], SamplingParams], Awaitable[GenerateResult]]


async def resubmit_until_done(
    submit: Submit,
    rid: str | None,
    input_ids: list[int],
    sampling: SamplingParams,
    *,
    max_resubmits: int,
    live: dict[str, str],
    user_aborted: set[str],
    version: int,
) -> GenerateResult:
    """Submit `input_ids` plus the tokens so far until a segment ends for another reason than a push's abort (a
    user's abort ends it too), at most `max_resubmits` times more. `live` maps `rid` to the server-side id of its
    current submission (rid, then rid/r1, rid/r2, ...) for aborts; both entries are cleared at the end. Every token
    keeps the version the server reported for it (`version` when there were none). Without a `rid` one is made up."""
    rid = rid or f"envhub-{uuid.uuid4().hex}"
    output_ids: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    finish: FinishReason = "length"
    submissions = 0
    try:
        for attempt in range(max_resubmits + 1):
            remaining = sampling.max_new_tokens - len(output_ids)
            if remaining <= 0:  # nothing (more) to generate: a resubmission would ask for 0 tokens
                finish = "length"
                break
            live[rid] = rid if attempt == 0 else f"{rid}/r{attempt}"
            submissions += 1
            segment = await submit(live[rid], list(input_ids) + output_ids, replace(sampling, max_new_tokens=remaining))
            output_ids += segment.output_ids
            logprobs += segment.logprobs
            versions += segment.token_versions
            finish = segment.finish_reason
            if finish != "abort" or rid in user_aborted:
                break
        if finish == "abort" and len(output_ids) >= sampling.max_new_tokens:
            finish = "length"  # aborted only after its last token: it ran its full length
    finally:
        live.pop(rid, None)
        user_aborted.discard(rid)
    return GenerateResult(
        output_ids=output_ids,
        logprobs=logprobs,
        finish_reason=finish,
        weight_version=versions[-1] if versions else version,
        meta={
            "rid": rid,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(output_ids),
            "resubmits": max(0, submissions - 1),
        },
        token_versions=versions,
    )
