"""Paged attention in native code (``radixserve/csrc``), reading K/V in place by slot.

Where the torch backend gathers every request's K/V into a padded block before attending
(three passes over the bytes), the kernel streams each slot's K/V once, straight from the
pool. A decode batch's requests that share a radix-tree path (``batch.prefix_groups``) read
the shared slots once for all their queries (cascade attention) and merge with their private
suffix by log-sum-exp. CPU only; float32 or bfloat16 K/V.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.attention.attention_plan import AttentionPlan, plan_attention
from radixserve.attention.base import AttentionBackend
from radixserve.attention.forward_batch import ForwardBatch
from radixserve.cache.shared_paths import PrefixGroupRule
from radixserve.csrc import load_native
from radixserve.memory.kv_pool import KVPool

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
# A lone prefill from position 0 attends only over its own new K/V, already in hand: from
# this length torch's flash kernel does that faster than streaming it back from the pool.
SELF_ATTENTION_MIN_LEN = 1024
# A prefix group pays on CPU only through lane use (its shared slots sit in cache for the
# plain kernel too): below ~4 vectors of 8 queries per KV head the merge and the extra
# items cost what the shared block saves (measured: 8 requests x 3 heads lose 10-25%).
CASCADE_MIN_QUERIES = 32
# For the same reason a member that already fills a vector on its own gains nothing: the
# group only adds the merge (tree-of-thought's 36 x 40-token extend over 240 shared tokens
# took 1.37x as long grouped). So groups are for decode-like members, one vector at most.
CASCADE_MAX_MEMBER_QUERIES = 8


class NativeAttentionBackend(AttentionBackend):
    name = "native"

    def __init__(
        self, kv_pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int, scale: float
    ) -> None:
        super().__init__(kv_pool, num_heads, num_kv_heads, head_dim, scale)
        device, dtype = kv_pool.k[0].device, kv_pool.k[0].dtype
        if device.type != "cpu":
            raise RuntimeError(f"the native backend runs on CPU, not {device}")
        if dtype not in SUPPORTED_DTYPES:
            raise RuntimeError(f"the native backend reads float32 or bfloat16 K/V, not {dtype}")
        self.kernels = load_native()
        if self.kernels is None:
            raise RuntimeError("the native kernels could not be built (see the log above)")

    def prefix_group_rule(self, min_shared: int) -> PrefixGroupRule:
        # queries per KV head = new tokens x query heads per KV head
        heads = self.num_heads // self.num_kv_heads
        return PrefixGroupRule(
            min_shared,
            min_group_tokens=-(-CASCADE_MIN_QUERIES // heads),
            max_member_tokens=CASCADE_MAX_MEMBER_QUERIES // heads,
        )

    def prepare(self, batch: ForwardBatch) -> None:
        if (
            batch.batch_size == 1
            and batch.prefix_lens[0] == 0
            and batch.extend_lens[0] >= SELF_ATTENTION_MIN_LEN
        ):
            batch.attn_metadata = None  # causal self-attention over the new tokens
            return
        groups = batch.prefix_groups
        slots = batch.kv_slots.numpy() if groups else None
        batch.attn_metadata = plan_attention(batch.seq_lens, batch.extend_lens, slots, groups)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.write(layer, batch.out_slots, k, v)
        if batch.attn_metadata is None:
            # [tokens, heads, head_dim] -> [1, heads, tokens, head_dim] and back
            out = F.scaled_dot_product_attention(
                *(t.transpose(0, 1)[None] for t in (q, k, v)),
                is_causal=True,
                scale=self.scale,
                enable_gqa=True,
            )
            return out[0].transpose(0, 1)
        out, _ = self.attend(layer, q, batch.kv_slots, batch.attn_metadata)
        return out.to(q.dtype)

    def attend(
        self, layer: int, q: torch.Tensor, kv_slots: torch.Tensor, plan: AttentionPlan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out [tokens, heads, head_dim], lse [tokens, heads])`` in float32; ``lse`` is the
        natural log of each row's softmax denominator over scaled scores."""
        return self.kernels.paged_attention(
            q,
            self.kv_pool.k[layer],
            self.kv_pool.v[layer],
            kv_slots,
            plan.items,
            plan.q_index,
            plan.merge_indptr,
            plan.merge_rows,
            self.scale,
        )
