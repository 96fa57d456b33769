"""The parts of a batch's attention that are dense blocks, for torch's CPU flash kernel or
the native block kernel.

Two shapes of work carry most of a prefill's attention arithmetic and are plain matrix
products once their K/V sit side by side: many queries over the same cached slots (the
members of a prefix group over their shared path, an extend over its own cached prefix),
and an extend's new tokens over themselves (causal, K/V in hand). torch's flash kernel runs
them at GEMM speed (302 GFLOP/s in float32 and 840 in bfloat16 on 5,952 queries x 1,024
keys here, AMX included) where the native kernel's per-query vectors reach about half of
that; the native kernel keeps what is irregular: decode rows and short extends. Every part
leaves a softmax state per (token, head) and ``merge`` combines them by log-sum-exp.

Grouped query attention folds into the query axis where nothing is causal: the ``G`` query
heads of a KV head are ``G`` more queries over the same keys.

Where the native block kernel (``csrc/block_attention.cpp``: outer-product tiles whose
scores stay in cache through the softmax) outruns the flash kernel here (``native_blocks``,
timed at first use: on AMD EPYCs, where torch's float32 BLAS is MKL's slow path and its
bfloat16 flash kernel has no AMX tiles), dense blocks go to it instead. There it ran
1.2-1.9x two oneDNN products with a native softmax between them (760 queries x 496 keys
3.8 ms a layer against 5.9; 1,984 x 1,024 21 against 25), which ran 1.6x the flash kernel.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from radixserve.attention.attention_plan import PrefixGroup, check_group
from radixserve.csrc import load_native, torch_has_bf16_instructions

# Queries per KV head from which a group member's share of the group's path goes to the
# flash kernel (31 prefills of 64 tokens under a 1,024-token prefix: 1.5x the native kernel
# in float32, 2.7x in bfloat16).
DENSE_MIN_QUERIES = 96
# Torch's flash kernel is fast in bfloat16 on AMX tiles; with AVX512_BF16 alone (an AMD
# EPYC) it ran 5,952 queries x 1,024 keys at 152 GFLOP/s, below float32's 163.
AMX = torch_has_bf16_instructions(amx_only=True)
# Queries x keys per KV head from which a request's own cached keys do: below it the
# block's gather, copies and merge cost more than the flash kernel saves (even at 384 x
# 1,024 in float32; at 192 x 1,024 it was 1.36x in bfloat16 on AMX).
DENSE_MIN_WORK = {
    torch.float32: 1 << 19,
    torch.bfloat16: 1 << 17 if AMX else 1 << 19,
}
# The same for bfloat16 in the native block kernel's pairwise dot products (AVX512_BF16),
# which the paged kernel's widened rows fall far behind: one layer of extends over their own
# cached keys took 0.61-0.84x the time from ~50,000 (8 x 80 new over 240-1,024 cached, 20 x
# 40 over 500), 1.09-1.16x at ~25,000 (AMD EPYC).
_BF16_DOT_MIN_WORK = 1 << 15
# New tokens from which an extend attends over itself in the flash kernel. Float32: the
# native kernel's sixteen-query vectors (AVX-512) were faster up to 2,048 tokens (7.4 ms
# against 10.1 a layer for 1,024), eight-query ones up to ~1,024 (1.4 ms against 2.0 for
# 367). bfloat16 on AMX: faster from 256 tokens (0.57 ms against 0.67; 1.5 against 2.1 for
# 512); elsewhere as float32 (the native kernel widens bfloat16: a 1,088-token prompt's 30
# layers took 0.26 s there against the flash kernel's 0.43 on an AMD EPYC).
_FLOAT32_SELF = 2048 if torch.backends.cpu.get_cpu_capability() == "AVX512" else 1024


# New tokens from which an extend attends over itself in the native block kernel where that
# takes the dense blocks (``native_blocks``): against the paged kernel a layer took 5.2 ms
# against 5.6 at 1,088 tokens, 1.56 against 1.69 at 540, a tie in the engine (AMD EPYC).
# bfloat16 with pairwise dot products: 0.81x from 128 tokens, 0.65x at 256.
_NATIVE_SELF = 1024
_BF16_DOT_SELF = 128


@functools.cache
def native_blocks(dtype: torch.dtype) -> bool:
    """Whether dense blocks go to the native block kernel rather than torch's flash kernel:
    whichever ran a block of 1,024 queries x 1,024 keys faster here (``_block_race``, once
    per process and dtype). The winner depends on the CPU, not only on its instructions:
    the flash kernel multiplies on torch's BLAS, and in bfloat16 at speed only on AMX
    tiles. On 5,952 queries x 1,024 keys a Zen 4 EPYC ran the block kernel at 180 GFLOP/s
    in float32 against the flash kernel's 135, and at 287 in bfloat16 against 123; on a Zen
    5 EPYC a 2,048-token prompt's 30 layers took 0.7 s natively against 1.28."""
    kernels = load_native()
    if kernels is None or dtype not in (torch.float32, torch.bfloat16):
        return False
    native, flash = _block_race(dtype)
    return native < flash


def _block_race(dtype: torch.dtype, rounds: int = 5) -> tuple[float, float]:
    """The best of ``rounds`` alternated calls' seconds, native then flash, on 256 tokens of
    four query heads (one KV head: 1,024 queries) over 1,024 keys scattered in a pool."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(256, 4, 64, generator=gen).to(dtype)
    k_pool, v_pool = (torch.randn(4096, 1, 64, generator=gen).to(dtype) for _ in range(2))
    block = SharedBlock(torch.arange(256), torch.randperm(4096, generator=gen)[:1024])
    best = [float("inf"), float("inf")]
    with torch.inference_mode():
        for _ in range(rounds + 1):  # the first round warms both up
            for i, run in enumerate((run_shared_native, run_shared_flash)):
                start = time.perf_counter()
                run(block, q, k_pool, v_pool, 0.125)
                best[i] = min(best[i], time.perf_counter() - start)
    return best[0], best[1]


def _bf16_dot_blocks(dtype: torch.dtype) -> bool:
    """Whether bfloat16 dense blocks run in the block kernel's bfloat16 dot products."""
    kernels = load_native()
    return dtype == torch.bfloat16 and native_blocks(dtype) and bool(kernels and kernels.bf16_dot())


def dense_min_work(dtype: torch.dtype) -> int:
    """Queries x keys per KV head from which cached keys make a dense block."""
    return _BF16_DOT_MIN_WORK if _bf16_dot_blocks(dtype) else DENSE_MIN_WORK[dtype]


def self_min_tokens(dtype: torch.dtype) -> float:
    """New tokens from which an extend attends over itself in a dense block."""
    if native_blocks(dtype):
        return _BF16_DOT_SELF if _bf16_dot_blocks(dtype) else _NATIVE_SELF
    return 256 if dtype == torch.bfloat16 and AMX else _FLOAT32_SELF


# A group of decode-like members stays a native cascade (the kernel reads the shared slots
# once for them and their short suffixes in the same pass) from this many queries per KV
# head; below it the members attend one by one.
CASCADE_MIN_QUERIES = 32

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
    dtype: torch.dtype,
) -> DenseSplit:
    """Which parts of a batch run as dense blocks; the rest stays with the native kernel.

    A group's members with many queries share one block over the group's path when their
    queries times that path reach ``dense_min_work`` (one 32-token prompt under a 336-token
    system prompt attended 1.5x faster in the native kernel); the others stay a native
    group (or attend alone when too few)."""
    seq = np.asarray(seq_lens, dtype=np.int64)
    ext = np.asarray(extend_lens, dtype=np.int64)
    kv_start, q_start = np.cumsum(seq) - seq, np.cumsum(ext) - ext
    prefix = seq - ext
    many = ext * heads_per_kv >= DENSE_MIN_QUERIES
    min_work, self_min = dense_min_work(dtype), self_min_tokens(dtype)
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
        if len(small) >= 2 and ext[small].sum() * heads_per_kv >= CASCADE_MIN_QUERIES:
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


def run_shared(
    block: SharedBlock, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, scale: float
) -> Part:
    if native_blocks(q.dtype) and block_kernel_takes(q.shape[2]):
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
    block: SelfBlock, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> Part:
    tokens = block.tokens
    if native_blocks(q.dtype) and block_kernel_takes(q.shape[2]):  # a call a request, in place
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
    one native pass (torch's gathers, scatters and products took 1.7 ms of a 30 ms layer
    for 31 prefills under a shared prefix; this takes 0.7)."""
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
