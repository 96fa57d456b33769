"""Many queries over K/V held side by side in the native block kernel, against softmax
attention in float64, and the dense blocks it serves against torch's flash kernel."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.cpu import dense_blocks
from radixserve.cpu.native import load_native, native_available

from .builds import TARGETS

pytestmark = pytest.mark.skipif(not native_available(), reason="native kernels did not build")


def reference(q, k, v, scale, causal_offset):
    """Softmax attention in float64: out [tokens, heads, dim], lse [tokens, heads]."""
    tokens, keys, group = len(q), len(k), q.shape[1] // k.shape[1]
    kk, vv = (x.double().repeat_interleave(group, 1) for x in (k, v))
    scores = torch.einsum("thd,khd->thk", q.double(), kk) * scale
    if causal_offset >= 0:
        visible = (causal_offset + torch.arange(tokens) + 1).clamp(0, keys)
        hidden = torch.arange(keys)[None, :] >= visible[:, None]
        scores = scores.masked_fill(hidden[:, None, :], -torch.inf)
    weights = torch.softmax(scores, -1).nan_to_num(0.0)  # a row that sees nothing: zeros
    return torch.einsum("thk,khd->thd", weights, vv).float(), torch.logsumexp(scores, -1).float()


@pytest.mark.parametrize("march", TARGETS)
@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(1, 70),
    keys=st.integers(0, 300),
    kv_heads=st.integers(1, 3),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([16, 64, 80, 128]),
    causal_offset=st.integers(-30, 300),
    spread=st.floats(0.1, 20.0),
    in_place=st.booleans(),
    bf16=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_block_attention_matches_softmax_attention(
    march, tokens, keys, kv_heads, group, head_dim, causal_offset, spread, in_place, bf16, seed
):
    """Ragged row tiles and key panels, every GQA grouping, causal rows that see no key,
    some keys or all of them, scores spread wide enough to test the softmax's range, rows
    picked by index from wider tensors (as a pool's slots and a batch's tokens are), and
    bfloat16 where the build multiplies it (against float64 on the same values)."""
    kernels = load_native(march)
    dtype = torch.bfloat16 if bf16 and kernels.bf16_dot() else torch.float32
    g = torch.Generator().manual_seed(seed)
    heads = kv_heads * group
    q = (torch.randn(tokens, heads, head_dim, generator=g) * spread).to(dtype)
    k, v = (torch.randn(keys, kv_heads, head_dim, generator=g).to(dtype) for _ in range(2))
    offset = causal_offset if causal_offset >= -10 else -1  # about a third not causal
    kernel = kernels.block_attention
    if in_place:  # the same values as rows of wider tensors, in shuffled order
        q_rows, key_rows = torch.randperm(tokens + 9)[:tokens], torch.randperm(keys + 5)[:keys]
        wide_q = torch.zeros(tokens + 9, heads * head_dim + 7, dtype=dtype)
        wide_q[q_rows, : heads * head_dim] = q.reshape(tokens, -1)
        kv = torch.zeros(keys + 5, 2 * kv_heads * head_dim, dtype=dtype)
        kv[key_rows] = torch.cat([k, v], 1).reshape(keys, 2 * kv_heads * head_dim)
        kv = kv.view(keys + 5, 2 * kv_heads, head_dim)
        view = wide_q[:, : heads * head_dim].view(tokens + 9, heads, head_dim)
        args = (view, q_rows, kv[:, :kv_heads], kv[:, kv_heads:], key_rows)
    else:
        args = (q, None, k, v, None)
    out, lse = kernel(*args, head_dim**-0.5, offset)
    ref_out, ref_lse = reference(q, k, v, head_dim**-0.5, offset)
    # float32 scores round by a fixed share of their size, so wide scores move the weights more
    atol = 2e-5 * max(1.0, spread / 4)
    torch.testing.assert_close(lse, ref_lse, atol=atol, rtol=1e-5)
    if dtype == torch.bfloat16:  # the weights are rounded to bfloat16 for their product with V
        torch.testing.assert_close(out, ref_out, atol=1e-2, rtol=1e-2)
    else:
        torch.testing.assert_close(out, ref_out, atol=atol, rtol=1e-4)


def test_block_attention_refuses_what_it_cannot_read():
    kernel = load_native().block_attention
    q, k = torch.randn(4, 6, 64), torch.randn(5, 4, 64)
    with pytest.raises(RuntimeError, match="multiple of kv_heads"):
        kernel(q, None, k, k, None, 0.125, -1)
    with pytest.raises(RuntimeError, match="takes float32"):
        kernel(q.double(), None, k[:, :3], k[:, :3], None, 0.125, -1)
    with pytest.raises(RuntimeError, match="of q's dtype"):
        kernel(q, None, k[:, :3].double(), k[:, :3].double(), None, 0.125, -1)
    with pytest.raises(RuntimeError, match="head_dim must be a multiple"):
        q66, k66 = torch.randn(4, 6, 66), torch.randn(5, 3, 66)
        kernel(q66, None, k66, k66, None, 0.125, -1)
    with pytest.raises(RuntimeError, match="key_rows names a row outside"):
        kernel(q, None, k[:, :3], k[:, :3], torch.tensor([0, 5]), 0.125, -1)
    with pytest.raises(RuntimeError, match="rows are contiguous"):
        kernel(q.transpose(0, 1), None, k[:, :3], k[:, :3], None, 0.125, -1)


def flash(q, k, v, causal):
    """torch's flash kernel on [tokens, heads, dim] q and [keys, kv_heads, dim] K/V."""
    group = q.shape[1] // k.shape[1]
    qf = q.transpose(0, 1)[None]
    kf, vf = (x.transpose(0, 1).repeat_interleave(group, 0)[None] for x in (k, v))
    out, lse = dense_blocks._flash(qf, kf, vf, 0.0, causal, scale=0.125)
    return out[0].transpose(0, 1), lse[0].transpose(0, 1)


@pytest.mark.parametrize("native", [True, False], ids=["native-block", "flash"])
@pytest.mark.parametrize("tokens, keys", [(1, 1), (37, 300), (700, 1024)])
@pytest.mark.parametrize("kv_heads, group", [(1, 1), (3, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_shared_block_on_either_path(native, tokens, keys, kv_heads, group, dtype):
    """Whichever path this CPU takes, both hold; bfloat16 values are compared in float32 (both
    kernels round the weights to bfloat16 for their product with V)."""
    rng = np.random.default_rng(tokens * keys)
    slots = torch.from_numpy(rng.permutation(4096)[:keys].astype(np.int64))
    k_pool, v_pool = (torch.randn(4096, kv_heads, 64).to(dtype).float() for _ in range(2))
    q = torch.randn(tokens + 5, kv_heads * group, 64).to(dtype).float()
    block = dense_blocks.SharedBlock(torch.arange(3, 3 + tokens), slots)
    q, k_pool, v_pool = q.to(dtype), k_pool.to(dtype), v_pool.to(dtype)
    part = dense_blocks.run_shared(block, q, k_pool, v_pool, 0.125, native)
    q, k_pool, v_pool = q.float(), k_pool.float(), v_pool.float()
    out, lse = flash(q[block.tokens], k_pool[slots], v_pool[slots], causal=False)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    assert part.out.shape == (tokens, kv_heads * group, 64)
    torch.testing.assert_close(part.out, out.float(), **tol)
    torch.testing.assert_close(part.lse, lse, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("native", [True, False], ids=["native-block", "flash"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prompts_over_themselves_on_either_path(native, dtype):
    """Two prompts of one length in one self block: each sees only its own tokens."""
    n, heads, kv_heads = 300, 6, 2
    q = torch.randn(2 * n + 4, heads, 64).to(dtype)
    k, v = (torch.randn(2 * n + 4, kv_heads, 64).to(dtype) for _ in range(2))
    tokens = torch.tensor([[4], [4 + n]]) + torch.arange(n)
    part = dense_blocks.run_self(dense_blocks.SelfBlock(tokens, n), q, k, v, 0.125, native)
    for i, t in enumerate(tokens):
        out, lse = flash(q[t].float(), k[t].float(), v[t].float(), causal=True)
        tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(part.out[i * n : (i + 1) * n], out, **tol)
        torch.testing.assert_close(part.lse[i * n : (i + 1) * n], lse, **tol)
