"""ModelRunner: the forward pass of a Llama-family transformers model over a `KVCache`, for prefill and decode.

It calls the model's own modules (embeddings, norms, rotary embedding) and its projections, MLPs and LM head either
as modules or, on a CPU in bf16, through oneDNN-packed copies of their weights that are packed again whenever a
parameter changes (`projections.py`), so weight updates copied into the model's parameters are what the next step
computes with. Only the attention and the cache handling are its own: each row's new keys/values are written into
its slot in place, and attention reads the slot directly (no concatenation, no padding of the past). Logits are
computed only for each row's last position.

Supported: decoder-only models whose layers look like Llama's (Llama, Mistral without sliding window, Qwen2,
Qwen3 with its q/k norms), i.e. SmolLM2 and the tiny test Llama. Anything else gets a clear error.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from envhub.errors import EngineError
from envhub.trainer.engines.embedded.decode_attention import DecodeAttention, unavailable_reason
from envhub.trainer.engines.embedded.decode_attention import load as load_decode_attention
from envhub.trainer.engines.embedded.kv_cache import KVCache, KVLayout
from envhub.trainer.engines.embedded.projections import projections_for
from envhub.trainer.engines.embedded.shapes import projection_rows, round_up

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def unsupported_reason(model: Any) -> str | None:
    """Why `model` cannot be served by the runner, or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention is not supported"
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        return f"layer types {sorted(set(layer_types))} are not all full attention"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "the model has no decoder layers with a rotary embedding"
    return None


def kv_layout(model: Any) -> KVLayout:
    """The per-token KV shape of `model` on its device and dtype."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    parameter = next(model.parameters())
    return KVLayout(
        layers=config.num_hidden_layers,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        dtype=parameter.dtype,
        device=parameter.device,
    )


class ModelRunner:
    """Runs prefill and decode steps of a supported model, reading and writing `cache` in place."""

    def __init__(
        self,
        model: Any,
        cache: KVCache,
        *,
        expand_gqa: bool | None = None,
        packed: bool | None = None,
        native_decode: bool | None = None,
        pack_prefill: bool = False,
    ) -> None:
        reason = unsupported_reason(model)
        if reason:
            raise EngineError(
                f"EmbeddedEngine cannot serve this model: {reason}",
                hint="serve it with SGLang or vLLM (engine.kind) instead",
            )
        self.model = model
        self.cache = cache
        inner = model.model
        self.embed, self.layers, self.norm, self.rotary = inner.embed_tokens, inner.layers, inner.norm, inner.rotary_emb
        self.projections = projections_for(model, packed)  # packed: None = where supported (CPU bf16)
        layout = cache.layout
        self.kv_heads, self.head_dim = layout.kv_heads, layout.head_dim
        self.group = model.config.num_attention_heads // layout.kv_heads
        self.gqa = self.group > 1  # a plain bool (torch.compile would trace `group > 1` as a symbolic one)
        self.qk_norm = hasattr(self.layers[0].self_attn, "q_norm")
        self.device = layout.device
        # Decode folds each KV head's query group into the query axis on every device, so K/V are read once per
        # KV head. CPU's flash kernel with `enable_gqa` took 16-18 ms a layer for 32 rows x 320 keys on a 2-vCPU
        # EPYC without AMX against 3.4-4.1 ms folded, same numerics (benchmarks/engine_profile.py). For prefill,
        # CUDA's masked SDPA kernel (memory-efficient attention) has no GQA support and would fall back to the
        # math kernel, so heads are expanded there; CPU's flash kernel takes GQA itself. `expand_gqa` picks the
        # CUDA prefill path anywhere (tests run it on CPU).
        self.expand_gqa = (self.device.type == "cuda" if expand_gqa is None else expand_gqa) and self.gqa
        self.pad_projections = self.device.type == "cpu"  # oneDNN's per-shape primitives (`projection_rows`)
        # True: the pieces' tokens packed into one sequence, attention row by row (`_prefill_packed`), where it is
        # built for: a CPU, GQA left to the flash kernel. False: rows padded to the longest piece, one masked
        # attention over them all. Off by default: its 1.6x prefill gain in benchmarks/engine_prefill.py did not
        # carry over to `make demo` (docs/engines.md)
        self.pack_prefill = pack_prefill and self.device.type == "cpu" and not self.expand_gqa
        # CPU decode attention: the C kernel of decode_attention.py (None: where it builds and takes these shapes;
        # True: required, an error naming why it cannot be used; False: SDPA)
        self.decode_kernel, self.decode_attention = self._decode_kernel(layout, native_decode)

    def _decode_kernel(self, layout: KVLayout, wanted: bool | None) -> tuple[DecodeAttention | None, str]:
        """The decode-attention kernel (None: SDPA) and how decode attention runs, in words."""
        kernel, why = None, "native_decode=False"
        if wanted is not False:
            if self.device.type != "cpu":
                why = "it runs on CPU only"
            elif (kernel := load_decode_attention()) is None:
                why = unavailable_reason()
            else:
                probe_q = torch.empty((1, layout.kv_heads, self.group, layout.head_dim), dtype=layout.dtype)
                probe_k = torch.empty((1, layout.kv_heads, 1, layout.head_dim), dtype=layout.dtype)
                if not kernel.supports(probe_q, probe_k):
                    kernel = None
                    why = (
                        f"it does not take {layout.dtype} with head_dim {layout.head_dim} and {self.group} queries "
                        "a KV head"
                    )
        if kernel is None and wanted:
            raise EngineError(f"the native decode attention cannot be used: {why}", hint="leave it to SDPA")
        return kernel, "native kernel" if kernel is not None else f"SDPA ({why})"

    def prefill(self, first_slot: int, pieces: list[list[int]], pad_id: int) -> torch.Tensor:
        """Feed `pieces[i]` to row `first_slot + i` after the tokens it holds; returns last-position logits [rows, V].

        Packed (`pack_prefill`): see `_prefill_packed`. Otherwise rows are right-padded to the longest piece;
        padded positions write their keys into the scratch slot and their outputs are discarded.
        """
        if self.pack_prefill:
            return self._prefill_packed(first_slot, pieces)
        cache, device = self.cache, self.device
        rows, width = len(pieces), max(len(p) for p in pieces)
        if self.pad_projections:  # few attention shapes too: the CPU flash kernel caches GEMM kernels per shape
            width = round_up(width, 32)
        ids = torch.full((rows, width), pad_id, dtype=torch.long)
        for row, piece in enumerate(pieces):
            ids[row, : len(piece)] = torch.tensor(piece, dtype=torch.long)
        starts = torch.tensor(cache.lengths[first_slot : first_slot + rows], dtype=torch.long)
        counts = torch.tensor([len(p) for p in pieces], dtype=torch.long)
        offsets = torch.arange(width)
        positions = starts[:, None] + offsets[None, :]
        real = offsets[None, :] < counts[:, None]
        scratch = cache.slots
        write_slots = torch.where(real, torch.arange(first_slot, first_slot + rows)[:, None], scratch)
        write_positions = torch.where(real, positions, 0)
        extent = int((starts + counts).max())
        if self.pad_projections:
            extent = min(round_up(extent, 64), cache.capacity)  # keys past a row's tokens are finite and masked
        mask = torch.arange(extent)[None, None, :] <= positions[:, :, None]  # causal over each row's own tokens
        logits = self.forward(
            ids.to(device),
            positions.to(device),
            (write_slots.to(device), write_positions.to(device)),
            slice(first_slot, first_slot + rows),
            mask[:, None].to(device),
            (counts - 1).to(device),
        )
        for row, piece in enumerate(pieces):
            cache.lengths[first_slot + row] += len(piece)
        return logits

    def _prefill_packed(self, first_slot: int, pieces: list[list[int]]) -> torch.Tensor:
        """`prefill` with the pieces' tokens as one sequence: the projections and MLPs run on the real tokens only,
        and attention runs row by row, each row's queries over its own keys.

        A multi-turn engine's prefill step holds each row's new turn on top of a conversation it caches: pieces of
        different lengths, over caches of different lengths. Padded to the longest piece, the step ran its GEMMs on
        1.8-2.0x its tokens, and its attention on every row x the longest piece x the longest cache: 506 against 812
        tokens/s packed (`benchmarks/engine_prefill.py`, 2 threads, quiet). Each row's queries are padded to a
        multiple of 32 and its keys to one of 64 (the CPU flash kernel caches GEMM kernels per shape,
        `shapes.projection_rows`); padded queries are dropped and keys past the row's tokens are masked.
        """
        cache, device = self.cache, self.device
        counts = [len(piece) for piece in pieces]
        starts = cache.lengths[first_slot : first_slot + len(pieces)]
        ids = torch.tensor([token for piece in pieces for token in piece], dtype=torch.long)
        positions = torch.cat([torch.arange(start, start + count) for start, count in zip(starts, counts)])
        slots = torch.repeat_interleave(torch.arange(first_slot, first_slot + len(pieces)), torch.tensor(counts))
        segments, offset = [], 0
        for row, (start, count) in enumerate(zip(starts, counts)):
            queries = round_up(count, 32)
            extent = min(round_up(start + count, 64), cache.capacity)
            causal = torch.arange(extent)[None, :] <= (start + torch.arange(queries))[:, None]
            segments.append((offset, count, first_slot + row, extent, causal[None, None].to(device)))
            offset += count
        last = torch.tensor(counts).cumsum(0) - 1
        logits = self.forward(
            ids[None].to(device),
            positions[None].to(device),
            (slots[None].to(device), positions[None].to(device)),
            slice(first_slot, first_slot + len(pieces)),
            None,
            last.to(device),
            segments=segments,
        )
        for row, count in enumerate(counts):
            cache.lengths[first_slot + row] += count
        return logits

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, write_slots: torch.Tensor, width: int
    ) -> torch.Tensor:
        """One token per row of slots 0..rows-1 at `positions`; returns logits [rows, V] in float32.

        Pure tensor code with a fixed `width` (keys read per row), so it can be captured in a CUDA graph; rows
        beyond the live ones point `write_slots` at the scratch slot.
        """
        if self.decode_kernel is not None:  # the kernel reads each row up to its length: no mask
            mask, lengths = None, (positions + 1).clamp_(max=width)
        else:
            mask, lengths = (torch.arange(width, device=tokens.device) <= positions[:, None])[:, None, None, :], None
        return self.forward(
            tokens[:, None],
            positions[:, None],
            (write_slots[:, None], positions[:, None]),
            slice(0, tokens.shape[0]),
            mask,
            None,
            lengths,
        )

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        write_at: tuple[torch.Tensor, torch.Tensor],
        rows: slice,
        mask: torch.Tensor | None,
        last: torch.Tensor | None,
        lengths: torch.Tensor | None = None,
        segments: list[tuple[int, int, int, int, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """ids/positions [B, T]; write_at = (slots, positions) [B, T] where the new keys go; mask [B, 1, T, W]
        over the slots `rows` (None with `lengths` or `segments`); `last` [B] picks each row's output position
        (None: the only one); `lengths` [B] (decode on the native kernel, instead of a mask: keys per row);
        `segments` (packed prefill, B = 1): per row (offset, count, slot, key extent, causal mask) of its tokens
        in the sequence, and `last` then holds each row's last token in it."""
        batch, length = ids.shape
        self.projections.refresh()  # re-pack weights that changed since the last step (none, usually)
        hidden = self.embed(ids)
        cos, sin = self.rotary(hidden, positions)
        kv_rows = self._kv_rows(*write_at)
        tokens = batch * length
        padded = projection_rows(tokens) if self.pad_projections and length > 1 else tokens
        hidden = self._pad(hidden.reshape(tokens, -1), padded)  # [padded, hidden]: tokens as rows of every GEMM
        for index, layer in enumerate(self.layers):
            attended = self._attention(
                index,
                layer.self_attn,
                layer.input_layernorm(hidden),
                cos,
                sin,
                kv_rows,
                rows,
                mask,
                (batch, length),
                lengths,
                segments,
            )
            hidden = hidden + attended
            hidden = hidden + self.projections.mlp(index, layer.post_attention_layernorm(hidden))
        if segments is not None:
            hidden = hidden.index_select(0, last)
        elif last is None:
            hidden = hidden[:tokens].view(batch, length, -1)[:, -1]
        else:
            hidden = hidden[:tokens].view(batch, length, -1)[torch.arange(batch, device=hidden.device), last]
        return self.projections.head(self.norm(hidden)).float()

    def _kv_rows(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Where new keys go in a layer's cache seen as rows of `head_dim` values, in the order of a [B, heads, T]
        block: one `index_copy_` per layer and tensor instead of an advanced-indexing write (~16x slower on CPU)."""
        capacity = self.cache.keys[0].shape[2]
        heads = torch.arange(self.kv_heads, device=slots.device)[None, :, None]
        return ((slots[:, None, :] * self.kv_heads + heads) * capacity + positions[:, None, :]).reshape(-1)

    def _attend_row(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        slot: int,
        extent: int,
        causal: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """One row's queries [1, heads, count, d] over its slot's first `extent` keys; [1, heads, count, d]."""
        count = q.shape[2]
        q = F.pad(q, (0, 0, 0, causal.shape[2] - count))
        keys, values = keys[slot : slot + 1, :, :extent], values[slot : slot + 1, :, :extent]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=causal, scale=scale, enable_gqa=self.gqa)
        return out[:, :, :count]

    @staticmethod
    def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
        """`x` [n, d] with zero rows appended up to `rows` (padded rows stay finite through norms and MLPs)."""
        return x if x.shape[0] == rows else F.pad(x, (0, 0, 0, rows - x.shape[0]))

    def _attention(
        self,
        index: int,
        attn: Any,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_rows: torch.Tensor,
        rows: slice,
        mask: torch.Tensor | None,
        shape_in: tuple[int, int],
        lengths: torch.Tensor | None,
        segments: list[tuple[int, int, int, int, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """x [padded tokens, hidden] -> the attention output projected, same rows."""
        batch, length = shape_in
        tokens = batch * length
        shape = (batch, length, -1, self.head_dim)
        q, k, v = (projected[:tokens].view(shape) for projected in self.projections.qkv(index, x))
        if self.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        keys, values = self.cache.keys[index], self.cache.values[index]
        keys.view(-1, self.head_dim).index_copy_(0, kv_rows, k.reshape(-1, self.head_dim))
        values.view(-1, self.head_dim).index_copy_(0, kv_rows, v.transpose(1, 2).reshape(-1, self.head_dim))
        if lengths is not None:  # CPU decode: the C kernel reads each row's slot up to its length
            q = q.reshape(batch, self.kv_heads, self.group, self.head_dim)
            out = self.decode_kernel(q, keys, values, lengths, attn.scaling)
            out = out.reshape(batch, -1, length, self.head_dim).transpose(1, 2).reshape(tokens, -1)
            return self.projections.o(index, self._pad(out, x.shape[0]))
        if segments is not None:  # packed prefill: each row's queries over its own slot
            out = torch.cat(
                [
                    self._attend_row(q[:, :, offset : offset + count], keys, values, slot, extent, causal, attn.scaling)
                    for offset, count, slot, extent, causal in segments
                ],
                dim=2,
            )
            out = out.transpose(1, 2).reshape(tokens, -1)
            return self.projections.o(index, self._pad(out, x.shape[0]))
        width = mask.shape[-1]
        keys, values = keys[rows, :, :width], values[rows, :, :width]
        if length == 1 and self.gqa:  # decode: each KV head's query group as its query axis, K/V read once
            q = q.reshape(batch, self.kv_heads, self.group, self.head_dim)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
        elif not self.expand_gqa:  # CPU prefill: the flash kernel reads each KV head once for its query group
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=self.gqa
            )
        else:  # prefill: heads expanded for CUDA's masked kernel
            keys, values = keys.repeat_interleave(self.group, dim=1), values.repeat_interleave(self.group, dim=1)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
        out = out.reshape(batch, -1, length, self.head_dim).transpose(1, 2).reshape(tokens, -1)
        return self.projections.o(index, self._pad(out, x.shape[0]))
