"""Next-token sampling for a whole batch at once, with the behaviour logprob the learner must reproduce.

The logprob reported for a sampled token t is `log_softmax(logits / T)[t]` computed in float32 from the
model's raw logits, where T is the request's temperature (T = 1 for greedy, temperature <= 0). Penalties,
logit bias, min_p, top-k and top-p only change which tokens may be drawn and how likely; they do not change
the reported logprob. A learner recomputes the same quantity with `log_softmax(logits / T)` over the full
vocabulary.

Sampling parameters follow SGLang's `sampling_params`: temperature, top_p, top_k (-1 = all), min_p,
repetition_penalty (divides positive / multiplies negative logits of tokens already generated),
frequency_penalty (minus penalty x count) and presence_penalty (minus penalty once per generated token),
min_new_tokens (stop tokens are masked until reached). Penalties count the request's output tokens only.
"""

from __future__ import annotations

import torch

from envhub.inference import SamplingParams


def behavior_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) in float32 over the last axis (T = 1 when temperature <= 0)."""
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, dim=-1)


def _column(
    params: list[SamplingParams], name: str, device: torch.device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.tensor([getattr(p, name) for p in params], dtype=dtype, device=device)


def _apply_penalties(
    logits: torch.Tensor, params: list[SamplingParams], output_ids: list[list[int]], stop_ids: list[set[int]]
) -> torch.Tensor:
    """Repetition / frequency / presence penalties over each row's output tokens; stop tokens masked before
    min_new_tokens."""
    rows, vocab = logits.shape
    device = logits.device
    penalised = any(p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty for p in params)
    if penalised:
        counts = torch.zeros((rows, vocab), dtype=torch.float32, device=device)
        for row, ids in enumerate(output_ids):
            if ids:
                counts[row].index_add_(0, torch.tensor(ids, device=device), torch.ones(len(ids), device=device))
        seen = counts > 0
        repetition = _column(params, "repetition_penalty", device).unsqueeze(1)
        scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, scaled, logits)
        logits = logits - _column(params, "frequency_penalty", device).unsqueeze(1) * counts
        logits = logits - _column(params, "presence_penalty", device).unsqueeze(1) * seen.float()
    for row, (p, ids) in enumerate(zip(params, output_ids)):
        if len(ids) < p.min_new_tokens and stop_ids[row]:
            logits[row, [t for t in stop_ids[row] if 0 <= t < vocab]] = float("-inf")
    return logits


def _restrict(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Mask, per row, tokens outside top-k, below min_p x the top probability, or outside the top_p nucleus."""
    vocab = logits.shape[-1]
    device = logits.device
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
    top_p = _column(params, "top_p", device)
    min_p = _column(params, "min_p", device)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    rank = torch.arange(vocab, device=device).unsqueeze(0)
    drop = rank >= top_k.unsqueeze(1)
    drop |= (probs.cumsum(-1) - probs) >= top_p.unsqueeze(1)  # mass before this token already reaches top_p
    drop |= probs < min_p.unsqueeze(1) * probs[:, :1]
    drop[:, 0] = False  # the most likely token is always allowed
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _shaping(params: list[SamplingParams], output_ids: list[list[int]], stop_ids: list[set[int]]) -> bool:
    """Whether any row changes its logits before drawing (penalties, bias, stop masking, top-k/p, min-p)."""
    for p, ids, stops in zip(params, output_ids, stop_ids):
        if p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty or p.logit_bias:
            return True
        if p.top_k > 0 or p.top_p < 1 or p.min_p > 0 or (stops and len(ids) < p.min_new_tokens):
            return True
    return False


DRAW_BLOCK = 256  # vocabulary entries per block of the two-level inverse CDF


def _draw(weights: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of `weights` (probabilities up to a factor per row) by inverse CDF: one uniform per row
    (from the row's generator when it has one).

    Exact sampling from the categorical distribution, with one random number per row instead of one per
    vocabulary entry (torch.multinomial draws a whole row of exponentials: ~30x slower for a 49k vocabulary).
    The CDF is walked in two levels: the sums of blocks of `DRAW_BLOCK` entries (a vectorised reduction), then
    the running sum inside the one block the uniform falls in, instead of a running sum over the whole
    vocabulary (a sequential scan: ~4 ms per decode step of 32 rows x 49k on this CPU). A token of weight 0 is
    never drawn.
    """
    device = weights.device
    rows, vocab = weights.shape
    uniforms = torch.empty(rows, dtype=torch.float32, device=device)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        uniforms[shared] = torch.rand(len(shared), device=device)
    for i, generator in enumerate(generators):
        if generator is not None:
            uniforms[i] = torch.rand(1, generator=generator, device=generator.device).to(device)[0]
    if vocab % DRAW_BLOCK:
        weights = torch.nn.functional.pad(weights, (0, DRAW_BLOCK - vocab % DRAW_BLOCK))
    blocks = weights.view(rows, -1, DRAW_BLOCK)
    sums = blocks.sum(-1)
    coarse = sums.cumsum(-1)
    total = coarse[:, -1:]
    target = torch.minimum(uniforms[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(coarse, target, right=True).clamp_(max=coarse.shape[-1] - 1)  # its sum is > 0
    rest = target - (coarse.gather(1, block) - sums.gather(1, block))  # mass to walk inside the block
    fine = blocks.gather(1, block[:, :, None].expand(-1, -1, DRAW_BLOCK)).squeeze(1).cumsum(-1)
    last = fine[:, -1:]
    rest = torch.minimum(rest.clamp_(min=0), torch.nextafter(last, torch.zeros_like(last)))  # rounding of the sums
    inside = torch.searchsorted(fine, rest, right=True).clamp_(max=DRAW_BLOCK - 1)
    return (block * DRAW_BLOCK + inside).squeeze(1)


def sample_next(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    output_ids: list[list[int]] | None = None,
    stop_ids: list[set[int]] | None = None,
) -> tuple[list[int], list[float]]:
    """Draw one token per row of `logits` [rows, vocab]; returns the tokens and their behaviour logprobs.

    `output_ids` (tokens each row generated so far) feed the penalties; `stop_ids` are masked until a row
    has `min_new_tokens`. Rows with a generator draw from it (seeded requests do not depend on the batch).
    """
    rows = len(params)
    logits = logits.float()
    device = logits.device
    output_ids = output_ids if output_ids is not None else [[] for _ in range(rows)]
    stop_ids = stop_ids if stop_ids is not None else [set() for _ in range(rows)]
    temperatures = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    temperature = None
    if any(t != 1.0 for t in temperatures):
        temperature = torch.tensor(temperatures, device=device).unsqueeze(1)
    scaled = logits if temperature is None else logits / temperature
    # log_softmax(scaled)[t] = scaled[t] - top - log(sum(exp(scaled - top))); exp(scaled - top) is also what plain
    # sampling draws from, so one pass of exp serves both
    top = scaled.amax(dim=-1, keepdim=True)
    weights = (scaled - top).exp_()
    log_norm = top.squeeze(1) + weights.sum(-1).log()
    sampled = [row for row, p in enumerate(params) if p.temperature > 0]
    if not _shaping(params, output_ids, stop_ids):  # plain sampling: draw from the softmax itself
        tokens = logits.argmax(dim=-1) if len(sampled) < rows else torch.empty(rows, dtype=torch.long, device=device)
        if sampled:
            index = torch.tensor(sampled, device=device) if len(sampled) < rows else None
            drawn = _draw(
                weights if index is None else weights.index_select(0, index), [generators[r] for r in sampled]
            )
            if index is None:
                tokens = drawn
            else:
                tokens[index] = drawn
    else:
        tokens = _shaped_draw(logits, params, generators, output_ids, stop_ids, temperature, sampled)
    chosen = scaled.gather(1, tokens.unsqueeze(1)).squeeze(1) - log_norm
    packed = torch.stack([tokens.double(), chosen.double()]).tolist()  # one device-to-host copy (ids are exact)
    return [int(t) for t in packed[0]], packed[1]


def _shaped_draw(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    output_ids: list[list[int]],
    stop_ids: list[set[int]],
    temperature: torch.Tensor | None,
    sampled: list[int],
) -> torch.Tensor:
    """Tokens after penalties, logit bias, stop masking, temperature and top-k/top-p/min-p restriction."""
    shaped = _apply_penalties(logits.clone(), params, output_ids, stop_ids)
    for row, p in enumerate(params):
        for token, bias in p.logit_bias:
            shaped[row, token] += bias
    if temperature is not None:
        shaped = shaped / temperature
    tokens = shaped.argmax(dim=-1)
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        rows_params = [params[r] for r in sampled]
        chosen_logits = shaped.index_select(0, index)
        if any(0 < p.top_k < logits.shape[-1] or p.top_p < 1 or p.min_p > 0 for p in rows_params):
            chosen_logits = _restrict(chosen_logits, rows_params)
        probs = torch.softmax(chosen_logits, dim=-1)
        tokens[index] = _draw(probs, [generators[r] for r in sampled])
    return tokens
