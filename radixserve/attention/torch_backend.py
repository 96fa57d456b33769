"""The reference attention backend: plain torch on any device.

Gathers each request's K/V from the pool by slot into a padded ``[batch, kv_heads, max_seq,
head_dim]`` block (one ``index_select`` per tensor, straight into the layout SDPA reads
fastest) and attends the whole batch at once with ``scaled_dot_product_attention``. Extends
use an explicit mask, bottom-right causal within each request with padding masked out
(``is_causal=True`` would align the triangle top-left, wrong over a cached prefix); decode
batches, one query per request, mask only the padding. GQA is left to SDPA's
``enable_gqa``: no copy of K/V per query head.
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
    kv_rows: torch.Tensor  # [B * kv_heads * max_kv] rows of the pool viewed [slots * kv_heads, D]
    max_kv: int
    decode: bool
    # bool, True = attend. Decode: [B, 1, 1, max_kv], None when nothing is padded.
    # Extend: [B, 1, max_q, max_kv], None for a single prefill (plain causal).
    mask: torch.Tensor | None
    q_index: torch.Tensor | None  # extend: [B, max_q] token index of each padded query row
    q_valid: torch.Tensor | None  # extend: [B, max_q] bool

    @property
    def causal(self) -> bool:
        """A lone prefill from position 0: SDPA's own (top-left) causal mask is right there."""
        return self.mask is None and not self.decode


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def prepare(self, batch: ForwardBatch) -> None:
        device = batch.input_ids.device
        ext = torch.tensor(batch.extend_lens, device=device)
        seq = torch.tensor(batch.seq_lens, device=device)
        kv_start = torch.cumsum(seq, 0) - seq
        max_kv = int(seq.max())
        j = torch.arange(max_kv, device=device)
        kv_valid = j[None, :] < seq[:, None]
        positions = torch.where(kv_valid, kv_start[:, None] + j[None, :], kv_start[:, None])
        slots = batch.kv_slots[positions]  # [B, max_kv]
        heads = torch.arange(self.num_kv_heads, device=device)
        kv_rows = (slots[:, None, :] * self.num_kv_heads + heads[None, :, None]).reshape(-1)

        if batch.is_decode:
            # A single query per request sees its whole context: only padding is masked.
            mask = None if bool(kv_valid.all()) else kv_valid[:, None, None, :]
            batch.attn_metadata = TorchAttentionMetadata(kv_rows, max_kv, True, mask, None, None)
            return

        prefix = seq - ext
        q_start = torch.cumsum(ext, 0) - ext
        i = torch.arange(int(ext.max()), device=device)
        q_valid = i[None, :] < ext[:, None]
        q_index = torch.where(q_valid, q_start[:, None] + i[None, :], 0)
        mask = None
        if not (batch.batch_size == 1 and batch.prefix_lens[0] == 0):
            # query i of request b sits at position prefix[b] + i and sees keys 0 .. that.
            visible = j[None, None, :] <= (prefix[:, None] + i[None, :])[:, :, None]
            mask = visible & kv_valid[:, None, :]
            # Padding rows attend to key 0 only, so softmax never sees an all-masked row.
            mask |= (~q_valid)[:, :, None] & (j == 0)[None, None, :]
            mask = mask[:, None]
        batch.attn_metadata = TorchAttentionMetadata(kv_rows, max_kv, False, mask, q_index, q_valid)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        meta: TorchAttentionMetadata = batch.attn_metadata
        self.kv_pool.write(layer, batch.out_slots, k, v, batch.kv_copies)
        b, hkv, d = batch.batch_size, self.num_kv_heads, self.head_dim
        # kb, vb: [B, kv_heads, max_kv, head_dim], contiguous
        kb = self._gather(self.kv_pool.k[layer], meta).view(b, hkv, meta.max_kv, d)
        vb = self._gather(self.kv_pool.v[layer], meta).view(b, hkv, meta.max_kv, d)
        if meta.decode:
            qb = q.view(b, 1, self.num_heads, d).transpose(1, 2)  # [B, heads, 1, D]
        else:
            qb = q[meta.q_index].transpose(1, 2)  # [B, heads, max_q, D]
        if _SDPA_HAS_GQA:
            gqa = {"enable_gqa": True}
        else:
            group = self.num_heads // hkv
            kb, vb, gqa = kb.repeat_interleave(group, 1), vb.repeat_interleave(group, 1), {}
        out = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=meta.mask, is_causal=meta.causal, scale=self.scale, **gqa
        )
        if meta.decode:
            return out.view(b, self.num_heads, d)
        return out.transpose(1, 2)[meta.q_valid]

    def _gather(self, pool: torch.Tensor, meta: TorchAttentionMetadata) -> torch.Tensor:
        return torch.index_select(pool.view(-1, self.head_dim), 0, meta.kv_rows)
