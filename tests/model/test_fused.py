"""The fused elementwise kernels against their torch twins (``radixserve/cpu/elementwise.py``):
float32 within summation order, bfloat16 rounded the same way step by step."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.cpu import elementwise as fused
from radixserve.cpu.native import load_native, native_available

from .builds import TARGETS

pytestmark = pytest.mark.skipif(not native_available(), reason="native kernels did not build")


def both(fn, *args):
    """(native, torch) results of ``fn`` on fresh copies of ``args`` (some run in place)."""
    with torch.inference_mode():
        native = fn(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
        real = fused._kernels
        fused._kernels = lambda x: None
        try:
            twin = fn(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
        finally:
            fused._kernels = real
    return native, twin


def close(native, twin, dtype, norm=False):
    if dtype == torch.float32:
        torch.testing.assert_close(native, twin, rtol=1e-5, atol=1e-5)
    else:  # a norm's sum in another order may move the normalised value by one bfloat16
        # step, which the weight's product (rounded again) can carry to two of the result's
        step = 2.0**-6 * twin.float().abs().clamp_min(1e-3)
        assert ((native.float() - twin.float()).abs() <= (step if norm else 0)).all()


shapes = dict(
    rows=st.integers(1, 40),
    dim=st.integers(1, 80),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)


@settings(max_examples=60, deadline=None)
@given(**shapes, with_residual=st.booleans())
def test_add_rms_norm(rows, dim, dtype, seed, with_residual):
    g = torch.Generator().manual_seed(seed)
    x, r = (torch.randn(rows, dim, generator=g).to(dtype) for _ in range(2))
    w = (torch.rand(dim, generator=g) + 0.5).to(dtype)
    residual = r if with_residual else None

    def run(x, w, residual):
        out = fused.rms_norm(x, w, 1e-6, residual)
        return out, residual

    (out_n, res_n), (out_t, res_t) = both(run, x, w, residual)
    close(out_n, out_t, dtype, norm=True)
    if with_residual:  # the stream is updated in place, rounded like torch's add
        assert torch.equal(res_n, res_t) and torch.equal(res_t, r + x)


@pytest.mark.parametrize("march", TARGETS)
@settings(max_examples=60, deadline=None)
@given(**shapes)
def test_silu_mul_on_halves_of_one_projection(march, rows, dim, dtype, seed):
    """Both builds' vector widths (sixteen floats and eight, then single tails) against
    torch's two operations, rounded as they round."""
    g = torch.Generator().manual_seed(seed)
    both_halves = (torch.randn(rows, 2 * dim, generator=g) * 6).to(dtype)  # saturates sigmoid
    kernels = load_native(march)
    assert kernels is not None, f"the native kernels did not build for {march}"
    native = kernels.silu_mul(both_halves[:, :dim], both_halves[:, dim:])
    twin = torch.nn.functional.silu(both_halves[:, :dim]) * both_halves[:, dim:]
    close(native, twin, dtype)


@settings(max_examples=60, deadline=None)
@given(**shapes, heads=st.integers(1, 5))
def test_rope_in_place(rows, dim, dtype, seed, heads):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, heads, 2 * dim, generator=g).to(dtype)
    cos, sin = (torch.randn(rows, 1, 2 * dim, generator=g).to(dtype) for _ in range(2))
    native, twin = both(lambda t: fused.rope_(t, cos, sin), x)
    close(native, twin, dtype)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(0, 6),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**16),
    levels=st.integers(1, 5),
    specials=st.lists(st.sampled_from([float("nan"), float("inf"), float("-inf")]), max_size=4),
)
def test_argmax_rows_as_torch(rows, n, seed, levels, specials):
    """Greedy sampling's argmax: ties (few distinct values), infinities and NaN placed at
    random, as torch.argmax picks (the first maximum; of a row holding NaN, its first NaN)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (rows, n), generator=g).float()
    for value in specials:
        if rows:
            r, c = (int(torch.randint(0, d, (1,), generator=g)) for d in (rows, n))
            x[r, c] = value
    assert torch.equal(load_native().argmax_rows(x), x.argmax(-1))
