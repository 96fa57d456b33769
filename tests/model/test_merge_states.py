"""The native merge of attention parts' softmax states against the same merge in torch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.cpu.native import load_native, native_available

from .builds import TARGETS

pytestmark = pytest.mark.skipif(not native_available(), reason="native kernels did not build")


def torch_merge(tokens, outs, lses, num_tokens):
    """Each token's parts weighted by exp(lse - the largest lse), in float64."""
    heads, dim = outs[0].shape[1:]
    top = torch.full((num_tokens, heads), -torch.inf, dtype=torch.float64)
    for t, lse in zip(tokens, lses, strict=True):
        top[t] = torch.maximum(top[t], lse.double())
    total = torch.zeros(num_tokens, heads, dtype=torch.float64)
    out = torch.zeros(num_tokens, heads, dim, dtype=torch.float64)
    for t, o, lse in zip(tokens, outs, lses, strict=True):
        w = torch.where(lse == -torch.inf, 0.0, torch.exp(lse.double() - top[t]))
        total[t] += w
        out[t] += w[..., None] * o.double()
    seen = total > 0
    out = torch.where(seen[..., None], out / total.clamp_min(1e-300)[..., None], 0.0)
    return out, torch.where(seen, top + torch.log(total.clamp_min(1e-300)), -torch.inf)


@pytest.mark.parametrize("march", TARGETS)
@settings(max_examples=60, deadline=None)
@given(
    num_tokens=st.integers(1, 200),
    cover=st.lists(st.floats(0.05, 1.0), min_size=1, max_size=4),
    heads=st.sampled_from([1, 3, 9]),
    dim=st.sampled_from([4, 64]),
    blind=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**16),
)
def test_native_merge_equals_torch(march, num_tokens, cover, heads, dim, blind, seed):
    kernels = load_native(march)
    assert kernels is not None, f"the native kernels did not build for {march}"
    g = torch.Generator().manual_seed(seed)
    tokens, outs, lses = [], [], []
    for share in cover:  # each part: a random subset of the tokens, in random order
        n = max(1, int(share * num_tokens))
        t = torch.randperm(num_tokens, generator=g)[:n]
        lse = torch.randn(n, heads, generator=g) * 5
        lse[torch.rand(n, heads, generator=g) < blind] = -torch.inf  # saw no key there
        tokens.append(t)
        outs.append(torch.randn(n, heads, dim, generator=g))
        lses.append(lse)
    out, lse = kernels.merge_states(tokens, outs, lses, num_tokens)
    want_out, want_lse = torch_merge(tokens, outs, lses, num_tokens)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)


def test_merge_refuses_tokens_outside_the_batch():
    one = torch.zeros(1, 1, 4), torch.zeros(1, 1)
    with pytest.raises(RuntimeError, match="outside the batch"):
        load_native().merge_states([torch.tensor([3])], [one[0]], [one[1]], 2)
