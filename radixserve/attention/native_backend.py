"""Paged attention in native code (``radixserve/csrc``), reading K/V in place by slot.

Where the torch backend gathers every request's K/V into a padded block before attending
(three passes over the bytes), the kernel streams each slot's K/V once, straight from the
pool. A decode batch's requests that share a radix-tree path (``batch.prefix_groups``) read
the shared slots once for all their queries (cascade attention) and merge with their private
suffix by log-sum-exp. Dense blocks (extends over a shared or long cached prefix, a long
prompt over itself) go to torch's flash kernel or the native block kernel instead
(``dense_blocks.py``) and merge the same way. CPU only; float32 or bfloat16 K/V.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.attention import dense_blocks
from radixserve.attention.attention_plan import AttentionPlan, plan_attention
from radixserve.attention.base import AttentionBackend
from radixserve.attention.dense_blocks import (
    DenseSplit,
    Part,
    merge,
    run_self,
    run_shared,
    split_dense,
)
from radixserve.attention.forward_batch import ForwardBatch
from radixserve.cache.shared_paths import PrefixGroupRule
from radixserve.csrc import load_native
from radixserve.memory.kv_pool import KVPool

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class NativeMetadata:
    plan: AttentionPlan | None  # what the native kernel runs; None: nothing
    dense: DenseSplit


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
        # groups as block items, where the block kernel reads the pool's type and head size
        self.block_groups = (dtype == torch.float32 or self.kernels.bf16_dot()) and (
            dense_blocks.block_kernel_takes(head_dim)
        )

    def prefix_group_rule(self, min_shared: int) -> PrefixGroupRule:
        # queries per KV head = new tokens x query heads per KV head
        heads = self.num_heads // self.num_kv_heads
        return PrefixGroupRule(min_shared, -(-dense_blocks.CASCADE_MIN_QUERIES // heads))

    def prepare(self, batch: ForwardBatch) -> None:
        slots = batch.kv_slots.numpy()
        dense = split_dense(
            batch.seq_lens,
            batch.extend_lens,
            slots,
            batch.prefix_groups,
            self.num_heads // self.num_kv_heads,
            self.kv_pool.k[0].dtype,
        )
        plan = plan_attention(
            batch.seq_lens,
            batch.extend_lens,
            slots,
            dense.native_groups,
            keys_from=dense.keys_from,
            block_groups=self.block_groups,
        )
        batch.attn_metadata = NativeMetadata(plan if len(plan.items) else None, dense)

    def decode_plan(self, batch: ForwardBatch) -> AttentionPlan | None:
        meta: NativeMetadata = batch.attn_metadata
        if meta.dense.shared or meta.dense.selfs or batch.kv_copies is not None:
            return None
        if any(event is not None for event in self.kv_pool.loading):
            return None
        return meta.plan

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.write(layer, batch.out_slots, k, v, batch.kv_copies)
        out, _ = self.attend(layer, q, k, v, batch.kv_slots, batch.attn_metadata)
        return out.to(q.dtype)

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_slots: torch.Tensor,
        meta: NativeMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out [tokens, heads, head_dim], lse [tokens, heads])`` in float32; ``lse`` is the
        natural log of each row's softmax denominator over scaled scores. ``k``, ``v``: the
        new tokens' K/V (also in the pool by now)."""
        k_pool, v_pool = self.kv_pool.k[layer], self.kv_pool.v[layer]
        parts = [run_shared(b, q, k_pool, v_pool, self.scale) for b in meta.dense.shared]
        parts += [run_self(b, q, k, v, self.scale) for b in meta.dense.selfs]
        if (plan := meta.plan) is not None:
            out, lse = self.kernels.paged_attention(
                q,
                k_pool,
                v_pool,
                kv_slots,
                plan.items,
                plan.q_index,
                plan.merge_indptr,
                plan.merge_rows,
                self.scale,
            )
            if not parts:  # the kernel covered every token (every decode step)
                return out, lse
            parts.append(Part(torch.arange(len(q)), out, lse))
        return merge(parts, len(q))
