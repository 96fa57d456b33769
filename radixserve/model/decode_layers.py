"""A decode step's decoder layers in one native call (``csrc/decode_layers.cpp``).

Layer by layer from Python, a decode step makes about a dozen calls a layer (modules,
argument checks, small allocations), ~4 ms a step of bench-135m whatever the batch: at
batch 1 in bfloat16 as long as streaming its weights. The native loop runs the same kernels
in the same order, so its results equal the layer-by-layer path's bit for bit (the tests
compare them). It takes the forwards where every row is one request's next token, every
projection sits on column panels and one paged plan attends every row; any other forward
goes through the layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from radixserve.attention import AttentionBackend, ForwardBatch
from radixserve.csrc import load_native
from radixserve.model.linear import PANEL_MAX_ROWS


@dataclass(frozen=True)
class DecodeLayers:
    """Every layer's norms and panels in ``decode_layers``' order, and the shapes."""

    weights: tuple[torch.Tensor, ...]
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float

    @classmethod
    def build(cls, model: nn.Module) -> DecodeLayers | None:
        """From a Llama-family model whose weights are packed (``pack_weights``), or None
        where a layer has what the loop lacks (biases, q/k norms, a projection off panels)."""
        cfg = model.config
        if load_native() is None or cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias or cfg.qk_norm:
            return None
        weights: list[torch.Tensor] = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down_proj)
            if any(p is None or p.packed is None or p.packed.panels is None for p in projections):
                return None
            weights += [
                layer.input_layernorm.weight.detach(),
                attn.qkv.packed.panels,
                attn.o_proj.packed.panels,
                layer.post_attention_layernorm.weight.detach(),
                mlp.gate_up.packed.panels,
                mlp.down_proj.packed.panels,
            ]
        eps = model.model.layers[0].input_layernorm.eps
        return cls(
            tuple(weights),
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate_size,
            eps,
        )

    def __call__(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(the last layer's MLP output, the residual stream)`` for the embeddings ``x``
        of a decode step the loop takes, else None (nothing done)."""
        if len(x) > PANEL_MAX_ROWS[x.dtype] or not batch.is_decode or batch.return_all_logits:
            return None
        plan = backend.decode_plan(batch)
        if plan is None:
            return None
        pool = backend.kv_pool
        cos, sin = (t.reshape(len(x), self.head_dim).contiguous() for t in cos_sin)
        return load_native().decode_layers(
            x,
            self.weights,
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
