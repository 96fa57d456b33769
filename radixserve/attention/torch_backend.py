"""The reference attention backend: plain torch on any device.

Gathers each request's K/V from the pool by slot into a padded ``[batch, max_seq_len]`` block
and runs one ``scaled_dot_product_attention`` for the whole batch with an explicit mask:
bottom-right causal within each request, padding masked out. (``is_causal=True`` would align
the triangle top-left, wrong for an extend over a cached prefix.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixserve.attention.base import AttentionBackend
from radixserve.attention.forward_batch import ForwardBatch

_SDPA_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass(frozen=True)
class TorchAttentionMetadata:
    q_index: torch.Tensor  # [B, max_q] token index of each padded query row
    q_valid: torch.Tensor  # [B, max_q] bool
    kv_slots: torch.Tensor  # [B, max_kv] slot of each padded key position
    mask: torch.Tensor | None  # [B, 1, max_q, max_kv] bool, True = attend; None = plain causal


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def prepare(self, batch: ForwardBatch) -> None:
        device = batch.input_ids.device
        ext = torch.tensor(batch.extend_lens, device=device)
        seq = torch.tensor(batch.seq_lens, device=device)
        prefix = seq - ext
        q_start = torch.cumsum(ext, 0) - ext
        kv_start = torch.cumsum(seq, 0) - seq
        i = torch.arange(int(ext.max()), device=device)
        j = torch.arange(int(seq.max()), device=device)

        q_valid = i[None, :] < ext[:, None]
        q_index = torch.where(q_valid, q_start[:, None] + i[None, :], 0)
        kv_valid = j[None, :] < seq[:, None]
        kv_slots = batch.kv_slots[torch.where(kv_valid, kv_start[:, None] + j[None, :], 0)]

        single_prefill = batch.batch_size == 1 and batch.prefix_lens[0] == 0
        mask = None
        if not single_prefill:
            # query i of request b sits at position prefix[b] + i and sees keys 0 .. that.
            visible = j[None, None, :] <= (prefix[:, None] + i[None, :])[:, :, None]
            mask = visible & kv_valid[:, None, :]
            # Padding rows attend to key 0 only, so softmax never sees an all-masked row.
            mask |= (~q_valid)[:, :, None] & (j == 0)[None, None, :]
            mask = mask[:, None]
        batch.attn_metadata = TorchAttentionMetadata(q_index, q_valid, kv_slots, mask)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        meta: TorchAttentionMetadata = batch.attn_metadata
        self.kv_pool.write(layer, batch.out_slots, k, v)
        # [B, L, H, D] -> [B, H, L, D]
        qb = q[meta.q_index].transpose(1, 2)
        kb = self.kv_pool.k[layer][meta.kv_slots].transpose(1, 2)
        vb = self.kv_pool.v[layer][meta.kv_slots].transpose(1, 2)
        kwargs = {"enable_gqa": True}
        if not _SDPA_HAS_GQA:
            group = self.num_heads // self.num_kv_heads
            kb, vb = kb.repeat_interleave(group, 1), vb.repeat_interleave(group, 1)
            kwargs = {}
        out = F.scaled_dot_product_attention(
            qb,
            kb,
            vb,
            attn_mask=meta.mask,
            is_causal=meta.mask is None,
            scale=self.scale,
            **kwargs,
        )
        return out.transpose(1, 2)[meta.q_valid]
