"""A decode step's decoder layers in one native call (``csrc/decode_layers.cpp``).

Layer by layer from Python, a decode step makes about a dozen calls a layer (modules,
argument checks, small allocations), a cost that does not shrink with the batch and at
batch 1 rivals streaming the weights. The native loop runs the same kernels
in the same order, so its results equal the layer-by-layer path's bit for bit (the tests
compare them). It takes the forwards where every row's logits are wanted (decode steps, and
decode steps whose rows verify draft tokens: a few causal rows per request), every
projection sits on column panels and the native backend's paged plan alone attends every
row (``NativeMetadata.plan_only``); any other forward goes through the layers. The model
is read by its Hugging Face attribute names; nothing here imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixserve.cpu.native import load_native
from radixserve.cpu.paged_plan import NativeMetadata
from radixserve.cpu.profile import CpuProfile
from radixserve.cpu.quant_linear import QuantMatrix


@dataclass(frozen=True)
class DecodeLayers:
    """Every layer's norms and projections in ``decode_layers``' order, and the shapes."""

    norms: tuple[torch.Tensor, ...]
    projections: tuple[tuple, ...]  # (panels or codes, scales, offsets, group, bits, zero)
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    max_rows: int  # the most rows its projections take (panels' or quantized weights' bound)

    @classmethod
    def build(cls, model: nn.Module, profile: CpuProfile) -> DecodeLayers | None:
        """From a Llama-family model whose weights are packed (``pack_weights``) or quantized,
        or None where a layer has what the loop lacks (biases, q/k norms, a projection that
        is neither on panels nor quantized)."""
        dtype = model.model.norm.weight.dtype
        cfg, paths = model.config, profile.paths(dtype)
        if (
            not profile.native
            or paths is None
            or (dtype == torch.bfloat16 and not profile.features.bf16_dot)
            or cfg.qkv_bias
            or cfg.o_bias
            or cfg.mlp_bias
            or cfg.qk_norm
        ):
            return None
        norms: list[torch.Tensor] = []
        projections: list[tuple] = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projs = (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down_proj)
            parts = [_projection(p, profile.quant_int8_rows) for p in projs]
            if any(p is None for p in parts):
                return None
            norms += [layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight]
            projections += parts
        eps = model.model.layers[0].input_layernorm.eps
        bounds = (paths.panel_rows if p[1] is None else profile.quant_rows for p in projections)
        max_rows = min(bounds)
        if max_rows <= 0:
            return None
        return cls(
            tuple(n.detach() for n in norms),
            tuple(projections),
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate_size,
            eps,
            max_rows,
        )

    def __call__(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        batch: Any,
        backend: Any,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(the last layer's MLP output, the residual stream)`` for the embeddings ``x``
        of a decode step the loop takes, else None (nothing done). ``batch`` and
        ``backend``: the forward's ``ForwardBatch`` and attention backend."""
        if len(x) > self.max_rows or batch.return_all_logits:
            return None
        if len(batch.logit_index()) != len(x):  # the model keeps every row's logits after it
            return None
        meta = batch.attn_metadata
        if not isinstance(meta, NativeMetadata) or not meta.plan_only or meta.plan is None:
            return None
        plan, pool = meta.plan, backend.kv_pool
        cos, sin = (t.reshape(len(x), self.head_dim).contiguous() for t in cos_sin)
        return load_native().decode_layers(
            x,
            self.norms,
            self.projections,
            pool.k,
            pool.v,
            cos,
            sin,
            batch.out_slots,
            batch.kv_slots,
            plan.items,
            plan.q_index,
            plan.merge_indptr,
            plan.merge_rows,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.intermediate,
            self.eps,
            backend.scale,
        )


def _projection(p: Any, int8_rows: int) -> tuple | None:
    """A projection as ``decode_layers`` takes it: its panels, or its quantized weight."""
    quant = getattr(p, "quant", None)
    if isinstance(quant, QuantMatrix):
        return (*quant._args(), int8_rows)
    packed = getattr(p, "packed", None)
    if packed is None or packed.panels is None:
        return None
    return packed.panels, None, None, 0, 0, 0, 0
