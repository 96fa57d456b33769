"""Cascade (shared-prefix) attention in the native backend: requests grouped over their common
slots (a native cascade below the profile's dense_min_queries, a dense block from it) must
get what they get attended one by one, and the plan refuses false groups."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.attention import (
    ExtendRequest,
    ForwardBatch,
    NativeAttentionBackend,
    PrefixGroup,
)
from radixserve.cpu.native import load_native, native_available
from radixserve.cpu.paged_plan import BLOCK_KEYS, plan_attention
from radixserve.memory.kv_pool import KVPool

from .builds import TARGETS
from .profiles import here

pytestmark = pytest.mark.skipif(not native_available(), reason="native kernels did not build")


def grouped_batch(rng, shared_lens, members, private, extend):
    """Requests over random slots; group g's members start with the same shared_lens[g]
    slots. Returns the requests and the groups."""
    free = iter(rng.permutation(8192))
    take = lambda n: np.fromiter((next(free) for _ in range(n)), dtype=np.int64, count=n)  # noqa: E731
    requests, groups = [], []
    for shared_len, count in zip(shared_lens, members, strict=True):
        shared = take(shared_len)
        first = len(requests)
        for _ in range(count):
            n = int(rng.integers(0, private + 1)) + extend
            requests.append(ExtendRequest([0] * extend, np.concatenate([shared, take(n)])))
        groups.append(PrefixGroup(shared_len, tuple(range(first, first + count))))
    requests.append(ExtendRequest([0] * extend, take(int(rng.integers(1, 300)) + extend)))
    return requests, groups


@settings(max_examples=40, deadline=None)
@given(
    shared_lens=st.lists(st.integers(1, 1200), min_size=1, max_size=3),
    members=st.integers(2, 5),
    private=st.integers(0, 100),
    extend=st.sampled_from([1, 1, 3, 40]),
    kv_heads=st.sampled_from([1, 3]),
    group=st.sampled_from([1, 3]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_cascade_equals_plain(shared_lens, members, private, extend, kv_heads, group, dtype, seed):
    rng = np.random.default_rng(seed)
    requests, groups = grouped_batch(
        rng, shared_lens, [members] * len(shared_lens), private, extend
    )
    heads, head_dim = kv_heads * group, 64
    pool = KVPool(1, 8192, 1, kv_heads, head_dim, dtype)
    pool.k[0].normal_()
    pool.v[0].normal_()
    backend = NativeAttentionBackend(pool, heads, kv_heads, head_dim, head_dim**-0.5, here())
    n = sum(len(r.new_ids) for r in requests)
    q = torch.randn(n, heads, head_dim).to(dtype)
    plain = ForwardBatch.create(requests, 1)
    cascade = ForwardBatch.create(requests, 1, prefix_groups=groups)
    outs = []
    for batch in (plain, cascade):
        backend.prepare(batch)
        k, v = pool.k[0][batch.out_slots], pool.v[0][batch.out_slots]
        outs.append(backend.attend(0, q, k, v, batch.kv_slots, batch.attn_metadata))
    (o1, lse1), (o2, lse2) = outs
    meta = cascade.attn_metadata
    if extend * group >= here().dense_min_queries:
        # a group is a dense block when its queries times its path are work enough for one
        work = here().paths(dtype).dense_min_work
        blocks = [g for g in groups if len(g.members) * extend * group * g.shared_len >= work]
        assert len(meta.dense.shared) >= len(blocks) and not meta.dense.native_groups
    elif meta.dense.native_groups:
        items = meta.plan.items
        if backend.kernels.bf16_dot() or dtype == torch.float32:  # the block kernel takes it:
            # a group is block items of all its tokens, over its path in chunks
            blocks, native = items[items[:, 5] == 1], meta.dense.native_groups
            assert int(blocks[:, 3].sum()) == sum(g.shared_len for g in native)
            assert (blocks[:, 3] <= BLOCK_KEYS).all()
            assert set(blocks[:, 1].tolist()) == {len(g.members) * extend for g in native}
        else:  # chunked items, which add the shared rows to the plan
            assert not items[:, 5].any()
            assert meta.plan.num_rows > plain.attn_metadata.plan.num_rows
    # a dense block's bfloat16 output is rounded to bfloat16 (the native kernel's is not)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(o2, o1, **tol)
    torch.testing.assert_close(lse2, lse1, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_items(dtype, target):
    """A block item runs in the block kernel where it reads the pool's type, else (bfloat16
    without AVX512_BF16, which the backend never plans so) whole in the paged kernel; either
    gives what the members get attended one by one."""
    rng = np.random.default_rng(1)
    requests, groups = grouped_batch(rng, [1500, 40], [12, 11], 30, 1)
    pool = KVPool(1, 8192, 1, 3, 64, dtype)
    pool.k[0].normal_()
    pool.v[0].normal_()
    backend = NativeAttentionBackend(pool, 9, 3, 64, 0.125, here())
    backend.kernels = load_native(target)
    backend.block_groups = True
    q = torch.randn(len(requests), 9, 64).to(dtype)
    outs = []
    for batch in (
        ForwardBatch.create(requests, 1),
        ForwardBatch.create(requests, 1, prefix_groups=groups),
    ):
        backend.prepare(batch)
        k, v = pool.k[0][batch.out_slots], pool.v[0][batch.out_slots]
        outs.append(backend.attend(0, q, k, v, batch.kv_slots, batch.attn_metadata))
    assert int(batch.attn_metadata.plan.items[:, 5].sum()) == 3  # 1,500 keys in two
    # the bfloat16 block kernel rounds its softmax weights to bfloat16 for the product with V
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(outs[1][0], outs[0][0], **tol)
    torch.testing.assert_close(outs[1][1], outs[0][1], atol=2e-5, rtol=1e-5)


def test_plan_refuses_false_groups():
    rng = np.random.default_rng(0)
    requests, groups = grouped_batch(rng, [64], [3], 10, 1)
    slots = np.concatenate([r.context_slots for r in requests])
    seq = [r.seq_len for r in requests]
    ext = [1] * len(requests)
    plan_attention(seq, ext, slots, groups)  # the true group is accepted
    last = len(requests) - 1  # the ungrouped request has other slots
    with pytest.raises(ValueError, match="does not share"):
        plan_attention(seq, ext, slots, [PrefixGroup(64, (0, last))])
    with pytest.raises(ValueError, match="cached for every member"):
        plan_attention(seq, ext, slots, [PrefixGroup(10_000, (0, 1))])
    with pytest.raises(ValueError, match="at most one"):
        plan_attention(seq, ext, slots, [PrefixGroup(8, (0, 1)), PrefixGroup(8, (1, 2))])
    with pytest.raises(ValueError, match=">= 2 members"):
        plan_attention(seq, ext, slots, [PrefixGroup(8, (0,))])


@pytest.mark.parametrize("extend", [1, 3, 40, 2048])
def test_the_backend_groups_members_of_any_size(extend):
    """A group's shared path is one dense block for all its members' queries, however many
    new tokens each brings (a prefill batch under one system prompt is the largest case)."""
    pool = KVPool(1, 64, 1, 3, 64, torch.float32)
    rule = NativeAttentionBackend(pool, 9, 3, 64, 0.125, here()).prefix_group_rule(64)
    assert rule.min_shared == 64
    assert rule.takes_member(extend)
    # at least four vectors of 8 queries per KV head (3 query heads each) in a group
    assert rule.takes_group([1] * 11) and not rule.takes_group([1] * 10)
