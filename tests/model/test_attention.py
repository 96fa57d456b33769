"""The attention backends (torch, native) against a direct per-request softmax over the same
K/V, computed in float64."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.attention import (
    ExtendRequest,
    ForwardBatch,
    NativeAttentionBackend,
    TorchAttentionBackend,
    native_backend,
)
from radixserve.cpu.native import load_native, native_available
from radixserve.memory.kv_pool import KVPool

from .builds import TARGETS
from .profiles import here, make_backend, with_paths

BACKENDS = [
    TorchAttentionBackend,
    pytest.param(
        NativeAttentionBackend,
        marks=pytest.mark.skipif(not native_available(), reason="native kernels did not build"),
    ),
]


def reference(q, pool, layer, batch, scale, group):
    """Per request and per query: softmax over keys 0 .. prefix + i, in float64."""
    out, t, kv = [], 0, 0
    for ext, seq in zip(batch.extend_lens, batch.seq_lens, strict=True):
        slots = batch.kv_slots[kv : kv + seq]
        k = pool.k[layer][slots].double().repeat_interleave(group, 1)  # [seq, H, D]
        v = pool.v[layer][slots].double().repeat_interleave(group, 1)
        for i in range(ext):
            visible = seq - ext + i + 1
            scores = torch.einsum("hd,shd->hs", q[t + i].double(), k[:visible]) * scale
            out.append(torch.einsum("hs,shd->hd", scores.softmax(-1), v[:visible]))
        t, kv = t + ext, kv + seq
    return torch.stack(out)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=5),
    kv_heads=st.sampled_from([1, 2, 3]),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([8, 16]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_torch_backend_matches_reference(lens, kv_heads, group, head_dim, dtype, seed):
    check_against_reference(lens, kv_heads, group, head_dim, dtype, seed)


@pytest.mark.skipif(not native_available(), reason="native kernels did not build")
@pytest.mark.parametrize("march", TARGETS)
@settings(max_examples=60, deadline=None)
@given(
    # long enough contexts to cut keys into chunks and extends into query blocks
    lens=st.lists(st.tuples(st.integers(0, 1100), st.integers(1, 70)), min_size=1, max_size=4),
    kv_heads=st.sampled_from([1, 2, 3]),
    group=st.sampled_from([1, 3, 4, 8]),
    head_dim=st.sampled_from([8, 12, 16, 48, 64, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_native_backend_matches_reference(march, lens, kv_heads, group, head_dim, dtype, seed):
    check_against_reference(
        lens, kv_heads, group, head_dim, dtype, seed, NativeAttentionBackend, 4608, march
    )


@pytest.mark.parametrize("backend_cls", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "lens",
    [
        [(10, 1), (3, 1), (0, 1)],
        [(7, 1), (7, 1)],
        [(0, 1100)],
        [(0, 2100)],  # past every threshold for attending over itself in a dense block
        [(1100, 200), (600, 300), (5, 1)],
    ],
    ids=["ragged", "even", "lone-prefill", "long-prefill", "long-extends"],
)
def test_decode_batches(lens, dtype, backend_cls):
    check_against_reference(lens, 3, 3, 16, dtype, 1, backend_cls, pool_slots=4096)


@pytest.mark.skipif(not native_available(), reason="native kernels did not build")
@pytest.mark.parametrize("native", [True, False], ids=["native-block", "flash"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_over_itself_in_a_dense_block(monkeypatch, native, dtype):
    """Whichever kernel this CPU sends long prompts to, both paths hold."""
    kernel = "native" if native else "flash"
    profile = with_paths(dtype, self_min_tokens=1024, dense_kernel=kernel)
    calls = []
    run_self = native_backend.run_self
    monkeypatch.setattr(native_backend, "run_self", lambda *a: calls.append(a[-1]) or run_self(*a))
    check_against_reference(
        [(0, 1100), (3, 1)], 3, 3, 16, dtype, 1, NativeAttentionBackend, 2048, profile=profile
    )
    assert calls == [native]  # the block ran, in the kernel the profile names


def check_against_reference(
    lens,
    kv_heads,
    group,
    head_dim,
    dtype,
    seed,
    backend_cls=TorchAttentionBackend,
    pool_slots=256,
    march="native",
    profile=None,
):
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    total = sum(p + e for p, e in lens)
    pool = KVPool(2, pool_slots, 1, kv_heads, head_dim, dtype)
    slots = rng.permutation(pool_slots)[:total]  # any slots: backends read by slot
    requests, start = [], 0
    for prefix, ext in lens:
        requests.append(ExtendRequest([0] * ext, slots[start : start + prefix + ext]))
        start += prefix + ext
    batch = ForwardBatch.create(requests, page_size=1)
    # The cached prefixes' K/V are already in the pool; new tokens' come with the call.
    for layer in range(2):
        pool.k[layer].copy_(torch.randn(pool.k[layer].shape, generator=gen).to(dtype))
        pool.v[layer].copy_(torch.randn(pool.v[layer].shape, generator=gen).to(dtype))
    n = len(batch.input_ids)
    heads = kv_heads * group
    q = torch.randn(n, heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
    scale = 1 / math.sqrt(head_dim)
    backend = make_backend(backend_cls, pool, heads, kv_heads, head_dim, scale, profile=profile)
    if march != "native":
        backend.kernels = load_native(march)
        assert backend.kernels is not None, f"the native kernels did not build for {march}"
    backend.prepare(batch)
    out = backend.forward(1, q, k, v, batch)
    assert torch.equal(pool.k[1][batch.out_slots], k)
    expected = reference(q, pool, 1, batch, scale, group)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert out.shape == (n, heads, head_dim)
    assert (out.double() - expected).abs().max() < tol


def test_batch_validation():
    with pytest.raises(ValueError):
        ForwardBatch.create([], page_size=1)
    with pytest.raises(ValueError, match="new token"):
        ForwardBatch.create([ExtendRequest([], np.arange(3))], page_size=1)
    with pytest.raises(ValueError):
        ForwardBatch.create([ExtendRequest([1, 2, 3], np.arange(2))], page_size=1)


def test_backend_names():
    from radixserve.attention import resolve_backend_name

    native = "native" if native_available() else "torch"
    assert resolve_backend_name("auto", "cpu", torch.float32, here()) == native
    assert resolve_backend_name("auto", "cpu", torch.float16, here()) == "torch"
    assert resolve_backend_name("auto", "cpu") == "torch"  # no CPU profile, no native paths
    assert resolve_backend_name("flashinfer", "cpu") == "flashinfer"
    with pytest.raises(ValueError, match="unknown attention backend"):
        resolve_backend_name("xformers", "cpu")
