import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.cpu import linear as linear_module
from radixserve.cpu import onednn
from radixserve.cpu.linear import FusedLinear, Linear, cpu_linear, use_profile
from radixserve.cpu.native import load_native, native_available
from radixserve.cpu.profile import ALWAYS, NEVER

from .builds import TARGETS
from .profiles import here, with_paths

NATIVE_ROWS = 48
FEW_ROWS = 128
PANEL_ROWS = 64


def linear(x, w, b=None, profile=None):
    return cpu_linear(x, w, b, profile or here())


def test_this_machines_profile_has_the_bounds_these_tests_cross():
    f32 = here().float32
    assert here().few_rows == FEW_ROWS
    if here().native:
        assert (f32.native_rows, f32.panel_rows) == (NATIVE_ROWS, PANEL_ROWS)


needs_native = pytest.mark.skipif(not native_available(), reason="native kernels did not build")


@pytest.mark.parametrize("rows", [1, 7, NATIVE_ROWS, NATIVE_ROWS + 1, FEW_ROWS, FEW_ROWS + 1, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_torch_at_any_row_count(rows, bias):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g)
    w = torch.randn(160, 96, generator=g)
    b = torch.randn(160, generator=g) if bias else None
    out = linear(x, w, b)
    assert out.is_contiguous() and out.shape == (rows, 160) and out.dtype == torch.float32
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 5, NATIVE_ROWS, 64, 300])
def test_bfloat16_rows_match_torch_within_rounding(rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=g).bfloat16()
    w = torch.randn(48, 64, generator=g).bfloat16()
    out = linear(x, w)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 48)
    # float32 accumulation, one rounding at the end: within bfloat16's step of the exact sum
    exact = F.linear(x.double(), w.double())
    torch.testing.assert_close(out.double(), exact, rtol=1e-2, atol=2e-2)


@needs_native
@pytest.mark.parametrize("march", TARGETS)
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, NATIVE_ROWS + 3),
    n_in=st.integers(1, 80),
    n_out=st.integers(1, 40),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_native_kernel_equals_torch(march, rows, n_in, n_out, dtype, seed):
    """Every remainder: rows not a multiple of the tile, widths not of the vector, outputs
    not of the block."""
    kernels = load_native(march)
    assert kernels is not None, f"the native kernels did not build for {march}"
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=g)
    w = torch.randn(n_out, n_in, generator=g).to(dtype)
    got = kernels.linear_rows(x, w)
    assert got.dtype == torch.float32 and got.shape == (rows, n_out)
    torch.testing.assert_close(got, F.linear(x, w.float()), rtol=1e-5, atol=1e-4)


@needs_native
def test_decode_rows_take_the_native_kernel(monkeypatch):
    calls = []
    real = load_native()

    class Spy:
        def linear_rows(self, x, w):
            calls.append(len(x))
            return real.linear_rows(x, w)

    monkeypatch.setattr(linear_module, "load_native", lambda: Spy())
    w = torch.randn(16, 8)
    for rows in (3, NATIVE_ROWS, NATIVE_ROWS + 1):
        linear(torch.randn(rows, 8), w)
    assert calls == [3, NATIVE_ROWS]  # float32: few rows only
    # bfloat16: any number of rows where torch's bfloat16 GEMM is slow, few where it is fast
    linear(
        torch.randn(500, 8).bfloat16(),
        w.bfloat16(),
        profile=with_paths(torch.bfloat16, native_rows=ALWAYS),
    )
    assert calls[-1] == 500
    del calls[:]
    few = with_paths(torch.bfloat16, native_rows=8)
    for rows in (8, 9, 500):
        linear(torch.randn(rows, 8).bfloat16(), w.bfloat16(), profile=few)
    assert calls == [8]


def test_without_native_kernels_few_rows_still_match(monkeypatch):
    monkeypatch.setattr(linear_module, "load_native", lambda: None)
    profile = with_paths(
        torch.bfloat16, with_paths(torch.float32, native_rows=NEVER), native_rows=NEVER
    )
    x, w = torch.randn(5, 24), torch.randn(40, 24)
    torch.testing.assert_close(linear(x, w, None, profile), F.linear(x, w), rtol=1e-5, atol=1e-4)
    xb, wb = x.bfloat16(), w.bfloat16()
    assert torch.equal(linear(xb, wb, None, profile), F.linear(xb, wb))


def test_gradients_and_other_shapes_take_torchs_path():
    layer = Linear(16, 32)
    layer.profile = here()
    x = torch.randn(4, 16, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    x3 = torch.randn(2, 3, 16)
    w = torch.randn(32, 16)
    assert torch.equal(linear(x3, w), F.linear(x3, w))


def test_linear_module_keeps_nn_linear_parameter_names():
    ref = torch.nn.Linear(8, 4)
    layer = Linear(8, 4)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(3, 8)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), ref(x))


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_kernel_across_row_chunks(dtype):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64 * 2 + 5, 40, generator=g)
    w = torch.randn(23, 40, generator=g).to(dtype)
    torch.testing.assert_close(
        load_native().linear_rows(x, w), F.linear(x, w.float()), rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize(
    "dtype, rtol, atol",
    # bfloat16: both accumulate in float32 and round once; only the order of sums may differ
    [(torch.bfloat16, 1e-2, 2e-2), (torch.float32, 1e-5, 1e-4)],
)
@pytest.mark.parametrize("rows", [1, 5, 24, 32, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_linear_gives_what_the_plain_one_gives(dtype, rtol, atol, rows, bias):
    # float32 packs only where oneDNN outruns torch's BLAS; test its path wherever it exists
    if not onednn.supports(dtype):
        pytest.skip(f"torch's oneDNN has no {dtype} GEMM on this CPU")
    profile = with_paths(dtype, onednn_rows=24)
    g = torch.Generator().manual_seed(rows)
    layer = Linear(96, 160, bias=bias).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(160, 96, generator=g))
        if bias:
            layer.bias.copy_(torch.randn(160, generator=g))
    x = torch.randn(rows, 96, generator=g).to(dtype)
    with torch.inference_mode():
        plain = layer(x)
        added = use_profile(layer, profile, packed=True)
        packed = layer(x)
    assert layer.packed is not None and added == layer.packed.nbytes >= 160 * 96 * dtype.itemsize
    assert "packed" not in layer.state_dict()  # checkpoints and twins see the plain weight
    torch.testing.assert_close(packed.float(), plain.float(), rtol=rtol, atol=atol)


@needs_native
@pytest.mark.parametrize("march", TARGETS)
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, PANEL_ROWS + 3),
    n_in=st.integers(1, 80),
    n_out=st.integers(1, 120),
    seed=st.integers(0, 2**16),
)
def test_panel_kernel_equals_torch(march, rows, n_in, n_out, seed):
    """Every remainder: rows not a multiple of the tile, outputs not of the panel width."""
    kernels = load_native(march)
    assert kernels is not None, f"the native kernels did not build for {march}"
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=g)
    w = torch.randn(n_out, n_in, generator=g)
    got = kernels.panel_linear(x, kernels.pack_panels(w), n_out)
    assert got.dtype == torch.float32 and got.shape == (rows, n_out)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-4)


@needs_native
def test_panels_of_a_weight_without_inputs_give_zeros():
    kernels = load_native()
    out = kernels.panel_linear(torch.randn(3, 0), kernels.pack_panels(torch.randn(5, 0)), 5)
    assert torch.equal(out, torch.zeros(3, 5))


@needs_native
def test_panels_refuse_a_weight_of_another_shape():
    kernels = load_native()
    panels = kernels.pack_panels(torch.randn(50, 16))
    with pytest.raises(RuntimeError, match="pack_panels"):
        kernels.panel_linear(torch.randn(2, 16), panels, 200)
    with pytest.raises(RuntimeError, match="pack_panels"):
        kernels.panel_linear(torch.randn(2, 17), panels, 50)


@needs_native
def test_float32_decode_rows_take_the_panels(monkeypatch):
    """Up to ``panel_rows`` rows on the panels, more on oneDNN's layout where it is packed."""
    profile = with_paths(torch.float32, onednn_rows=24 if onednn.available() else None)
    layer = Linear(32, 40)
    with torch.inference_mode():
        use_profile(layer, profile, packed=True)
    assert layer.packed is not None and layer.packed.panels is not None
    calls = []
    real = load_native()

    class Spy:
        def panel_linear(self, x, panels, out):
            calls.append(len(x))
            return real.panel_linear(x, panels, out)

    monkeypatch.setattr(linear_module, "load_native", lambda: Spy())
    with torch.inference_mode():
        top = PANEL_ROWS
        for rows in (1, top, top + 1):
            x = torch.randn(rows, 32)
            out = layer(x)
            torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))
    assert calls == [1, top]


@needs_native
@pytest.mark.parametrize("march", TARGETS)
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 20),
    n_in=st.integers(1, 80),
    n_out=st.integers(1, 120),
    seed=st.integers(0, 2**16),
)
def test_bfloat16_panels_round_as_torch_does(march, rows, n_in, n_out, seed):
    """float32 sums of bfloat16 products, one rounding: torch's bfloat16 GEMM up to the
    order of the sums, odd input widths included; refused cleanly without AVX512_BF16."""
    kernels = load_native(march)
    assert kernels is not None, f"the native kernels did not build for {march}"
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=g).bfloat16()
    w = torch.randn(n_out, n_in, generator=g).bfloat16()
    if not kernels.bf16_dot():
        with pytest.raises(RuntimeError, match="AVX512_BF16"):
            kernels.pack_panels(w)
        return
    got = kernels.panel_linear(x, kernels.pack_panels(w), n_out)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n_out)
    exact = F.linear(x.double(), w.double())
    torch.testing.assert_close(got.double(), exact, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("rows", [1, 20, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_give_each_parts_output_and_store_nothing_twice(rows, bias):
    torch.manual_seed(0)
    parts = [Linear(64, n, bias=bias) for n in (64, 16, 16)]
    x = torch.randn(rows, 64)
    with torch.no_grad():
        expected = [F.linear(x, p.weight, p.bias) for p in parts]
        fused = FusedLinear(parts, here())
        outs = fused(x)
    for out, want, part in zip(outs, expected, parts, strict=True):
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        # the part's weight is a view of the fused one's rows: stored once
        assert part.fused and part.weight.untyped_storage().data_ptr() == (
            fused.weight.untyped_storage().data_ptr()
        )


def test_fused_projections_refuse_a_bias_on_some_parts_only():
    with pytest.raises(ValueError, match="bias"):
        FusedLinear([Linear(8, 8, bias=True), Linear(8, 8, bias=False)], here())
