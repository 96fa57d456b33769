"""Scores to softmax weights in place with each row's log-sum-exp (the native twin of torch's
softmax and logsumexp), and the shared blocks it serves, against torch's flash kernel."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.attention import dense_blocks
from radixserve.csrc import load_native, native_available, onednn

from .builds import TARGETS

pytestmark = pytest.mark.skipif(not native_available(), reason="native kernels did not build")


@pytest.mark.parametrize("march", TARGETS)
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 1100),
    spread=st.floats(0.0, 30.0),
    blind=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**16),
)
def test_softmax_rows_match_torch(march, rows, cols, spread, blind, seed):
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(rows, cols + 3, generator=g) * spread
    wide[torch.rand(rows, generator=g) < blind] = -torch.inf  # rows that saw nothing
    scores = wide[:, :cols]  # rows apart by more than their length
    ref = scores.double()
    lse = load_native(march).softmax_rows(scores)
    empty = ref.amax(-1) == -torch.inf
    expected = torch.where(empty[:, None], 0.0, torch.softmax(ref, -1))
    torch.testing.assert_close(scores, expected.float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, torch.logsumexp(ref, -1).float(), atol=1e-5, rtol=1e-6)


@pytest.mark.skipif(not onednn.available(), reason="torch has no oneDNN here")
@pytest.mark.parametrize("tokens, keys", [(1, 1), (37, 300), (700, 1024)])
@pytest.mark.parametrize("kv_heads, group", [(1, 1), (3, 3), (2, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_shared_block_by_gemm_equals_the_flash_kernel(tokens, keys, kv_heads, group, dtype):
    """Past GEMM_CHUNK query rows the block goes chunk by chunk; bfloat16 is widened, so it
    matches the flash kernel on the same values in float32."""
    rng = np.random.default_rng(tokens * keys)
    slots = torch.from_numpy(rng.permutation(4096)[:keys].astype(np.int64))
    pools = [torch.randn(4096, kv_heads, 64).to(dtype).float() for _ in range(2)]
    q = torch.randn(tokens + 5, kv_heads * group, 64).to(dtype).float()
    block = dense_blocks.SharedBlock(torch.arange(3, 3 + tokens), slots)
    gemm = dense_blocks.run_shared_gemm(block, q.to(dtype), *(p.to(dtype) for p in pools), 0.125)
    k_pool, v_pool = pools
    heads = kv_heads * group
    qf = q[block.tokens].transpose(0, 1)[None]  # [1, heads, tokens, 64]
    kf = k_pool[slots].transpose(0, 1).repeat_interleave(group, 0)[None]
    vf = v_pool[slots].transpose(0, 1).repeat_interleave(group, 0)[None]
    out, lse = dense_blocks._flash(qf, kf, vf, 0.0, False, scale=0.125)
    assert gemm.out.shape == (tokens, heads, 64) and gemm.lse.shape == (tokens, heads)
    torch.testing.assert_close(gemm.out, out[0].transpose(0, 1), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(gemm.lse, lse[0].transpose(0, 1), atol=2e-5, rtol=1e-5)
