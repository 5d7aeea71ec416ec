"""The linear layers of a model step: the model's own modules, or (CPU, bf16) oneDNN-packed copies of their weights
with q/k/v and gate/up fused.

Why packed: `F.linear` on a bf16 CPU tensor hands oneDNN a plain row-major weight on every call, and oneDNN lays it
out for its kernel each time (or looks up a per-shape copy). `torch.ops.mkldnn._reorder_linear_weight` lays a weight
out once; `_linear_pointwise` then multiplies with it directly, with the same result bit for bit (checked at 1 to 512
rows). Fusing q/k/v into one matmul and gate/up into another halves the matmuls of a layer, so a step meets half the
OpenMP barriers. A 32-row SmolLM2 decode step's projections and LM head at 1 thread on a 2-vCPU EPYC (AVX-512 BF16,
no AMX): 74 ms plain, 50 ms packed and fused (docs/engines.md, "Packed projections on a CPU in bf16").

The model's parameters stay the source of truth: a packed copy remembers the version counter and storage of every
parameter it was made from, and is made again before the next step that finds one changed (a weight update, a
`load_state_dict`, any in-place write), so nothing has to announce a change. The cost is a second copy of the
projection and LM-head weights (for SmolLM2 in bf16, 268 MB).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Sources = tuple[torch.Tensor, ...]


def packing_supported(model: Any) -> str | None:
    """Why `model`'s projections cannot be packed here, or None when they can."""
    parameter = next(model.parameters())
    if parameter.device.type != "cpu" or parameter.dtype != torch.bfloat16:
        return "packing is for bf16 weights on the CPU"
    mkldnn = getattr(torch.ops, "mkldnn", None)
    if mkldnn is None or not torch.backends.mkldnn.is_available() or not mkldnn._is_mkldnn_bf16_supported():
        return "this torch build or CPU has no oneDNN bf16 matmul"
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for group in ((attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)):
            if len({linear.bias is None for linear in group}) > 1:
                return "a fused group mixes linear layers with and without bias"
        if not hasattr(mlp, "act_fn"):
            return "the MLP has no act_fn"
    return None


class Packed:
    """One packed matmul: `weights` (and `biases`) stacked along the output axis, laid out by oneDNN, re-made when
    any of them changes."""

    def __init__(self, weights: Sources, biases: Sources, rows_hint: int) -> None:
        self.weights, self.biases, self.rows_hint = weights, biases, rows_hint
        self._made_from: tuple[tuple[int, int], ...] = ()
        self.weight = self.bias = None
        self.refresh()

    def _fingerprint(self) -> tuple[tuple[int, int], ...]:
        return tuple((t._version, t.data_ptr()) for t in self.weights + self.biases)

    def refresh(self) -> bool:
        """Pack again if a source changed since the last packing; True when it did."""
        fingerprint = self._fingerprint()
        if fingerprint == self._made_from:
            return False
        with torch.no_grad():
            stacked = self.weights[0] if len(self.weights) == 1 else torch.cat(self.weights)
            self.weight = torch.ops.mkldnn._reorder_linear_weight(stacked.detach(), self.rows_hint)
            self.bias = torch.cat(self.biases).detach() if self.biases else None
        self._made_from = fingerprint
        return True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight, self.bias, "none", [], "")


class ModuleProjections:
    """The model's own linear modules (GPU, fp32, and the reference the packed path is tested against)."""

    def __init__(self, model: Any) -> None:
        self.layers = model.model.layers
        self.lm_head = model.get_output_embeddings()

    def refresh(self) -> int:
        """Nothing to re-make; returns the number of packed matmuls made again (0)."""
        return 0

    def qkv(self, index: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = self.layers[index].self_attn
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    def o(self, index: int, x: torch.Tensor) -> torch.Tensor:
        return self.layers[index].self_attn.o_proj(x)

    def mlp(self, index: int, x: torch.Tensor) -> torch.Tensor:
        return self.layers[index].mlp(x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(x)


class PackedProjections:
    """The same projections as `ModuleProjections`, from packed weights: per layer q|k|v, o, gate|up and down."""

    def __init__(self, model: Any, rows_hint: int = 32) -> None:
        def packed(*linears: Any) -> Packed:
            biases = tuple(linear.bias for linear in linears if linear.bias is not None)
            return Packed(tuple(linear.weight for linear in linears), biases, rows_hint)

        self._qkv, self._o, self._gate_up, self._down = [], [], [], []
        self._splits: list[tuple[int, int, int]] = []
        self._act: list[Callable[[torch.Tensor], torch.Tensor]] = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self._qkv.append(packed(attn.q_proj, attn.k_proj, attn.v_proj))
            self._splits.append(tuple(linear.weight.shape[0] for linear in (attn.q_proj, attn.k_proj, attn.v_proj)))
            self._o.append(packed(attn.o_proj))
            self._gate_up.append(packed(mlp.gate_proj, mlp.up_proj))
            self._down.append(packed(mlp.down_proj))
            self._act.append(mlp.act_fn)
        self._intermediate = model.model.layers[0].mlp.gate_proj.weight.shape[0]
        self._head = packed(model.get_output_embeddings())
        self._all = self._qkv + self._o + self._gate_up + self._down + [self._head]

    def refresh(self) -> int:
        """Re-make the packed weights whose parameters changed; returns how many were made again."""
        return sum(packed.refresh() for packed in self._all)

    def qkv(self, index: int, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._qkv[index](x).split(self._splits[index], dim=-1)

    def o(self, index: int, x: torch.Tensor) -> torch.Tensor:
        return self._o[index](x)

    def mlp(self, index: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = self._gate_up[index](x).split(self._intermediate, dim=-1)
        return self._down[index](self._act[index](gate) * up)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self._head(x)


def projections_for(model: Any, packed: bool | None = None) -> ModuleProjections | PackedProjections:
    """Packed where supported unless `packed` is False; `packed=True` where unsupported is an error."""
    reason = packing_supported(model) if packed is not False else "off"
    if packed and reason:
        raise ValueError(f"cannot pack this model's projections: {reason}")
    return ModuleProjections(model) if reason else PackedProjections(model)
