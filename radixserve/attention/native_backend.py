"""Paged attention in native code (``radixserve/cpu/csrc``), reading K/V in place by slot.

Where the torch backend gathers every request's K/V into a padded block before attending
(three passes over the bytes), the kernel streams each slot's K/V once, straight from the
pool. A decode batch's requests that share a radix-tree path (``batch.prefix_groups``) read
the shared slots once for all their queries (cascade attention) and merge with their private
suffix by log-sum-exp. Dense blocks (extends over a shared or long cached prefix, a long
prompt over itself) go to torch's flash kernel or the native block kernel instead
(``radixserve/cpu/dense_blocks.py``) and merge the same way; the ``CpuProfile`` says
which. CPU only; float32 or bfloat16 K/V.
"""

from __future__ import annotations

import torch

from radixserve.attention.base import AttentionBackend
from radixserve.attention.forward_batch import ForwardBatch
from radixserve.cache.shared_paths import PrefixGroupRule
from radixserve.cpu import CpuProfile
from radixserve.cpu.dense_blocks import Part, merge, run_self, run_shared, runs_native, split_dense
from radixserve.cpu.native import load_native
from radixserve.cpu.paged_plan import NativeMetadata, plan_attention
from radixserve.memory.kv_pool import KVPool

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


class NativeAttentionBackend(AttentionBackend):
    name = "native"

    def __init__(
        self,
        kv_pool: KVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        profile: CpuProfile,
    ) -> None:
        super().__init__(kv_pool, num_heads, num_kv_heads, head_dim, scale)
        device, dtype = kv_pool.k[0].device, kv_pool.k[0].dtype
        if device.type != "cpu":
            raise RuntimeError(f"the native backend runs on CPU, not {device}")
        if dtype not in SUPPORTED_DTYPES:
            raise RuntimeError(f"the native backend reads float32 or bfloat16 K/V, not {dtype}")
        self.kernels = load_native()
        if self.kernels is None or not profile.native:
            raise RuntimeError("the native kernels could not be built (see the log above)")
        self.profile, self.paths = profile, profile.paths(dtype)
        self.native_blocks = runs_native(self.paths, head_dim)
        # groups as block items, where the block kernel reads the pool's type and head size
        self.block_groups = (dtype == torch.float32 or profile.features.bf16_dot) and (
            head_dim % self.kernels.block_dim_multiple() == 0
        )

    def prefix_group_rule(self, min_shared: int) -> PrefixGroupRule:
        # queries per KV head = new tokens x query heads per KV head
        heads = self.num_heads // self.num_kv_heads
        return PrefixGroupRule(min_shared, -(-self.profile.cascade_min_queries // heads))

    def prepare(self, batch: ForwardBatch) -> None:
        slots = batch.kv_slots.numpy()
        dense = split_dense(
            batch.seq_lens,
            batch.extend_lens,
            slots,
            batch.prefix_groups,
            self.num_heads // self.num_kv_heads,
            self.profile,
            self.paths,
        )
        plan = plan_attention(
            batch.seq_lens,
            batch.extend_lens,
            slots,
            dense.native_groups,
            keys_from=dense.keys_from,
            block_groups=self.block_groups,
        )
        plan_only = not (dense.shared or dense.selfs or batch.kv_copies is not None) and all(
            event is None for event in self.kv_pool.loading
        )
        batch.attn_metadata = NativeMetadata(plan if len(plan.items) else None, dense, plan_only)

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
        native = self.native_blocks
        parts = [run_shared(b, q, k_pool, v_pool, self.scale, native) for b in meta.dense.shared]
        parts += [run_self(b, q, k, v, self.scale, native) for b in meta.dense.selfs]
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
