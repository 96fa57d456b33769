"""The parts of a batch's attention that are dense blocks, for torch's CPU flash kernel or
the native block kernel.

Two shapes of work carry most of a prefill's attention arithmetic and are plain matrix
products once their K/V sit side by side: many queries over the same cached slots (the
members of a prefix group over their shared path, an extend over its own cached prefix),
and an extend's new tokens over themselves (causal, K/V in hand). Both the flash kernel and
the native block kernel (``csrc/block_attention.cpp``: outer-product tiles whose scores stay
in cache through the softmax) run them near GEMM speed; which one a dtype takes, and from
how much work a block pays for its gathers and merge, is the ``CpuProfile``'s
(``DtypePaths.dense_kernel``, ``dense_min_work``, ``self_min_tokens``). The paged kernel
keeps what is irregular: decode rows and short extends. Every part leaves a softmax state
per (token, head) and ``merge`` combines them by log-sum-exp.

Grouped query attention folds into the query axis where nothing is causal: the ``G`` query
heads of a KV head are ``G`` more queries over the same keys.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from radixserve.cache.shared_paths import PrefixGroup, check_group
from radixserve.cpu.native import load_native
from radixserve.cpu.profile import CpuProfile, DtypePaths

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass(frozen=True)
class SharedBlock:
    """Batch tokens ``tokens`` over pool slots ``slots``, every key visible to every one."""

    tokens: torch.Tensor
    slots: torch.Tensor


@dataclass(frozen=True)
class SelfBlock:
    """Requests whose ``length`` new tokens are batch tokens ``tokens`` ``[requests,
    length]``: each over its own new K/V, causally (one batched call for all of them)."""

    tokens: torch.Tensor
    length: int


@dataclass(frozen=True)
class DenseSplit:
    shared: tuple[SharedBlock, ...]
    selfs: tuple[SelfBlock, ...]
    keys_from: np.ndarray  # per request: the first context key left to the native kernel
    native_groups: tuple[PrefixGroup, ...]


def split_dense(
    seq_lens: list[int],
    extend_lens: list[int],
    kv_slots: np.ndarray,
    groups: tuple[PrefixGroup, ...],
    heads_per_kv: int,
    profile: CpuProfile,
    paths: DtypePaths,
) -> DenseSplit:
    """Which parts of a batch run as dense blocks; the rest stays with the paged kernel.

    A group's members with many queries share one block over the group's path when their
    queries times that path reach ``paths.dense_min_work``; the others stay a native group
    (or attend alone when too few)."""
    seq = np.asarray(seq_lens, dtype=np.int64)
    ext = np.asarray(extend_lens, dtype=np.int64)
    kv_start, q_start = np.cumsum(seq) - seq, np.cumsum(ext) - ext
    prefix = seq - ext
    many = ext * heads_per_kv >= profile.dense_min_queries
    min_work, self_min = paths.dense_min_work, paths.self_min_tokens
    keys_from = np.zeros(len(seq), dtype=np.int64)
    shared: list[SharedBlock] = []
    native_groups = []
    claimed = np.zeros(len(seq), dtype=np.int64)
    for group in groups:
        check_group(group, prefix, kv_start, kv_slots, claimed)
        m = np.asarray(group.members)
        claimed[m] = group.shared_len
        big, small = m[many[m]], m[~many[m]]
        if ext[big].sum() * heads_per_kv * group.shared_len < min_work:
            big = big[:0]  # too little work for a block: the native kernel is faster
        if len(big):
            first = kv_start[m[0]]
            tokens = np.concatenate([np.arange(q_start[i], q_start[i] + ext[i]) for i in big])
            shared.append(_shared(tokens, kv_slots[first : first + group.shared_len]))
            keys_from[big] = group.shared_len
        if len(small) >= 2 and ext[small].sum() * heads_per_kv >= profile.cascade_min_queries:
            native_groups.append(PrefixGroup(group.shared_len, tuple(small.tolist())))
    by_length: dict[int, list[int]] = defaultdict(list)
    for i in np.flatnonzero(many):
        if ext[i] * heads_per_kv * (prefix[i] - keys_from[i]) >= min_work:
            own = kv_slots[kv_start[i] + keys_from[i] : kv_start[i] + prefix[i]]
            shared.append(_shared(np.arange(q_start[i], q_start[i] + ext[i]), own))
            keys_from[i] = prefix[i]
        if ext[i] >= self_min and keys_from[i] == prefix[i]:
            by_length[int(ext[i])].append(int(q_start[i]))
            keys_from[i] = seq[i]
    selfs = tuple(
        SelfBlock(torch.tensor(s)[:, None] + torch.arange(n), n) for n, s in by_length.items()
    )
    return DenseSplit(tuple(shared), selfs, keys_from, tuple(native_groups))


def _shared(tokens: np.ndarray, slots: np.ndarray) -> SharedBlock:
    return SharedBlock(torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(slots))


@dataclass(frozen=True)
class Part:
    """Softmax states of some batch tokens, each named at most once: ``out [n, heads,
    head_dim]`` float32 and ``lse [n, heads]`` (natural log of the softmax sum; -inf where a
    token saw nothing)."""

    tokens: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor


def block_kernel_takes(head_dim: int) -> bool:
    """Whether the native block kernel takes this head size (a multiple of its vectors)."""
    return head_dim % load_native().block_dim_multiple() == 0


def runs_native(paths: DtypePaths, head_dim: int) -> bool:
    """Whether dense blocks of this dtype and head size go to the native block kernel."""
    return paths.dense_kernel == "native" and block_kernel_takes(head_dim)


def run_shared(
    block: SharedBlock,
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    scale: float,
    native: bool,
) -> Part:
    if native:
        return run_shared_native(block, q, k_pool, v_pool, scale)
    return run_shared_flash(block, q, k_pool, v_pool, scale)


def run_shared_flash(
    block: SharedBlock, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, scale: float
) -> Part:
    """``run_shared`` in torch's flash kernel, the block's K/V gathered."""
    n, heads, dim = len(block.tokens), q.shape[1], q.shape[2]
    kv_heads = k_pool.shape[1]
    group = heads // kv_heads
    # [n, heads, dim] -> [1, kv_heads, n * group, dim]: a KV head's query heads side by side
    qf = q[block.tokens].view(n, kv_heads, group, dim).permute(1, 0, 2, 3)
    qf = qf.reshape(1, kv_heads, n * group, dim)
    k = k_pool[block.slots].permute(1, 0, 2)[None].contiguous()
    v = v_pool[block.slots].permute(1, 0, 2)[None].contiguous()
    out, lse = _flash(qf, k, v, 0.0, False, scale=scale)
    out = out.view(kv_heads, n, group, dim).permute(1, 0, 2, 3).reshape(n, heads, dim)
    lse = lse.view(kv_heads, n, group).permute(1, 0, 2).reshape(n, heads)
    return Part(block.tokens, out.float(), lse)


def run_shared_native(
    block: SharedBlock, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, scale: float
) -> Part:
    """``run_shared`` in the native block kernel, q and the pools read in place (bfloat16
    ones gathered and widened where the CPU has no bfloat16 dot products)."""
    kernels = load_native()
    if q.dtype == torch.float32 or kernels.bf16_dot():
        out, lse = kernels.block_attention(q, block.tokens, k_pool, v_pool, block.slots, scale, -1)
    else:
        k, v = k_pool[block.slots].float(), v_pool[block.slots].float()
        out, lse = kernels.block_attention(q[block.tokens].float(), None, k, v, None, scale, -1)
    return Part(block.tokens, out, lse)


def run_self(
    block: SelfBlock, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, native: bool
) -> Part:
    tokens = block.tokens
    if native:  # a call a request, in place
        kernels = load_native()
        if q.dtype != torch.float32 and not kernels.bf16_dot():
            q, k, v = q.float(), k.float(), v.float()
        parts = [kernels.block_attention(q, t, k, v, t, scale, 0) for t in tokens]
        out, lse = (torch.cat(x) for x in zip(*parts, strict=True))
        return Part(tokens.reshape(-1), out, lse)
    b, n, heads, dim = len(tokens), block.length, q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    qs = q[tokens].transpose(1, 2)  # [b, heads, n, dim]
    ks = k[tokens].transpose(1, 2).repeat_interleave(group, 1)
    vs = v[tokens].transpose(1, 2).repeat_interleave(group, 1)
    out, lse = _flash(qs, ks, vs, 0.0, True, scale=scale)
    out = out.transpose(1, 2).reshape(b * n, heads, dim)
    return Part(tokens.reshape(-1), out.float(), lse.transpose(1, 2).reshape(b * n, heads))


def merge(parts: list[Part], num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of every batch token from the parts that cover it, by log-sum-exp in
    one native pass (torch's gathers, scatters and products for it cost several times
    more)."""
    if len(parts) == 1 and len(parts[0].tokens) == num_tokens:
        part = parts[0]
        if torch.equal(part.tokens, torch.arange(num_tokens)):
            return part.out, part.lse
    return load_native().merge_states(
        [p.tokens for p in parts],
        [p.out.contiguous() for p in parts],
        [p.lse.contiguous() for p in parts],
        num_tokens,
    )
