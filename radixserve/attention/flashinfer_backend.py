"""FlashInfer paged attention (CUDA only; ``pip install 'radixserve[cuda]'``).

Decode-only batches run ``BatchDecodeWithPagedKVCacheWrapper``; any batch with an extend runs
``BatchPrefillWithPagedKVCacheWrapper`` (causal there is aligned bottom-right, as an extend
over a cached prefix needs) on FlashInfer's FA2 kernels, which take every head size (FA3,
Hopper only, takes 64/128/256) and JIT-build in a fraction of FA3's time. Page tables are
int32 CSR arrays built from each request's context slots, which come in whole pages. One
``plan()`` per batch serves every layer; both wrappers share one workspace buffer. Written to
the ``plan``/``run`` API that FlashInfer's 0.2.x to 0.7.x releases share.
"""

from __future__ import annotations

import torch

from radixserve.attention.base import AttentionBackend
from radixserve.attention.forward_batch import ForwardBatch
from radixserve.memory.kv_pool import KVPool

_WORKSPACE_BYTES = 128 * 1024 * 1024


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(
        self, kv_pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int, scale: float
    ) -> None:
        super().__init__(kv_pool, num_heads, num_kv_heads, head_dim, scale)
        try:
            import flashinfer
        except ImportError as exc:
            raise RuntimeError(
                "the flashinfer backend needs `pip install 'radixserve[cuda]'`"
            ) from exc
        device = kv_pool.k[0].device
        if device.type != "cuda":
            raise RuntimeError(f"the flashinfer backend runs on CUDA only, not {device}")
        self.dtype = kv_pool.k[0].dtype
        workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace, "NHD", backend="fa2"
        )
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")

    def prepare(self, batch: ForwardBatch) -> None:
        page = batch.page_size
        seq = torch.tensor(batch.seq_lens, dtype=torch.int32)
        ext = torch.tensor(batch.extend_lens, dtype=torch.int32)
        num_pages = (seq + page - 1) // page
        kv_start = torch.cumsum(seq, 0) - seq
        # Position p of a request lives in page kv_slots[p] // page; take each page's first slot.
        first_slot = torch.cat(
            [
                torch.arange(int(s), int(s) + int(n) * page, page)
                for s, n in zip(kv_start, num_pages, strict=True)
            ]
        )
        device = batch.input_ids.device
        kv_indices = (batch.kv_slots[first_slot.to(device)] // page).to(torch.int32)
        kv_indptr = torch.zeros(len(seq) + 1, dtype=torch.int32)
        kv_indptr[1:] = torch.cumsum(num_pages, 0)
        last_page_len = seq - (num_pages - 1) * page
        args = (kv_indptr.to(device), kv_indices, last_page_len.to(device))
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, page)
        dtypes = {"q_data_type": self.dtype, "kv_data_type": self.dtype, "sm_scale": self.scale}
        if batch.is_decode:
            self._decode.plan(*args, *heads, pos_encoding_mode="NONE", **dtypes)
            batch.attn_metadata = self._decode
        else:
            qo_indptr = torch.zeros(len(ext) + 1, dtype=torch.int32)
            qo_indptr[1:] = torch.cumsum(ext, 0)
            self._prefill.plan(qo_indptr.to(device), *args, *heads, causal=True, **dtypes)
            batch.attn_metadata = self._prefill

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.write(layer, batch.out_slots, k, v, batch.kv_copies)
        return batch.attn_metadata.run(q.contiguous(), self.kv_pool.pages(layer))
