"""Products and lookups on quantized weights: the native kernels (this CPU's build and the
AVX2 one) against torch on the dequantized weight, for every code layout, row count and
remainder; the packed form against the lossless repack it came from."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.cpu.native import load_native, native_available
from radixserve.cpu.quant_linear import QuantMatrix, quant_linear
from radixserve.model.quantized import FORMATS, QuantizedWeight, from_gguf, quantize
from radixserve.model.quantized_model import to_matrix

from .builds import TARGETS
from .profiles import here

needs_native = pytest.mark.skipif(not native_available(), reason="native kernels did not build")

# (bits, group, zero, with offsets, float16 scales): every layout the kernels take
LAYOUTS = [(4, 32, 8, False, False), (4, 32, 0, True, False), (8, 32, 0, False, False),
           (8, 16, 0, False, False), (8, 32, 0, True, False), (8, 16, 3, True, False),
           (4, 32, 8, False, True), (4, 32, 0, True, True), (8, 32, 0, False, True),
           (8, 16, 3, True, True)]  # fmt: skip


def random_matrix(out: int, n_in: int, layout, seed: int) -> QuantMatrix:
    """Scales and offsets that are float16 values where the layout says so (``pack``
    then keeps them as float16), float32 ones otherwise."""
    bits, group, zero, with_offset, half = layout
    rng = np.random.default_rng(seed)
    top = 16 if bits == 4 else 256
    codes = (rng.integers(0, top, (out, n_in)) - (zero if bits == 4 else 128 + zero)).astype(
        np.int8
    )
    kind = np.float16 if half else np.float32
    scale = rng.uniform(0.001, 0.1, (out, n_in // group)).astype(kind).astype(np.float32)
    offset = rng.normal(0, 0.1, scale.shape).astype(kind).astype(np.float32)
    matrix = QuantMatrix.pack(
        codes, scale, offset if with_offset else None, group, bits, zero, "test"
    )
    assert matrix.scale.dtype == (torch.float16 if half else torch.float32)
    return matrix


def assert_float32_accumulation(got: torch.Tensor, x: torch.Tensor, w: QuantMatrix) -> None:
    """``got`` is ``x`` times ``w``'s values up to float32 rounding of its sums: each error
    within a few ulps of the sum of the terms' magnitudes, a weight's terms (scale times
    code, the zero's part, offset) counted apart (which bounds any order and grouping of
    the additions)."""
    values = w.dequantize(native=False).double()
    offsets = torch.zeros_like(values)
    if w.offset is not None:
        offsets = w.offset.double().repeat_interleave(w.group, dim=1)
    zeros = (w.scale.double() * w.zero).abs().repeat_interleave(w.group, dim=1)
    exact = F.linear(x.double(), values)
    magnitude = (values - offsets).abs() + offsets.abs() + 2 * zeros
    scale = F.linear(x.double().abs(), magnitude)
    error = (got.double() - exact).abs()
    assert (error <= 4 * 2**-24 * scale + 1e-30).all(), float((error / scale).max())


@needs_native
@pytest.mark.parametrize("march", TARGETS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@settings(max_examples=30, deadline=None)
@given(
    # rows past the tile (6 or 4) and the 64-row chunk on a few groups; or the one- and
    # two-row tile (and a third row past it) over enough groups for its 16-group vectors
    shape=st.tuples(st.integers(1, 70), st.integers(1, 6))
    | st.tuples(st.integers(1, 3), st.integers(14, 40)),
    out=st.integers(1, 23),
    seed=st.integers(0, 2**16),
)
def test_native_product_equals_torch_on_the_dequantized_weight(march, layout, shape, out, seed):
    """Outputs past the weight block; the lookup kernel over the same weight."""
    rows, groups = shape
    kernels = load_native(march)
    assert kernels is not None, f"the native kernels did not build for {march}"
    w = random_matrix(out, groups * layout[1], layout, seed)
    x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(seed))
    args = (w.codes, w.scale, w.offset, w.group, w.bits, w.zero)
    got = kernels.quant_linear(x, *args)
    values = w.dequantize(native=False)
    assert got.dtype == torch.float32 and got.shape == (rows, out)
    assert_float32_accumulation(got, x, w)
    # the lookup kernel: the same values (one fused multiply-add apart), any rows, any order
    index = torch.randint(0, out, (7,), generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(kernels.dequantize_rows(*args, index), values[index])
    torch.testing.assert_close(kernels.dequantize_rows(*args, None), values)


def rounded_rows(x: torch.Tensor) -> torch.Tensor:
    """The kernels' int8 twin of ``x``: each group of 32 rounded to a step of max|x| / 127."""
    g = x.reshape(len(x), -1, 32)
    d = g.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return (torch.round(g * inv) * d).reshape(x.shape)


@needs_native
@pytest.mark.parametrize("march", TARGETS)
@pytest.mark.parametrize("layout", [x for x in LAYOUTS if x[0] == 4], ids=str)
@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 12),
    groups=st.integers(1, 6),
    out=st.integers(1, 23),
    seed=st.integers(0, 2**16),
)
def test_int8_activations_are_the_product_with_xs_rounded_twin(
    march, layout, rows, groups, out, seed
):
    """Up to ``int8_rows`` rows a 4-bit product rounds x to int8 per group of 32; above,
    x stays float32."""
    kernels = load_native(march)
    assert kernels is not None and kernels.int8_dot()
    w = random_matrix(out, groups * 32, layout, seed)
    x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(seed))
    x[0, :32] = 0  # a group of zeros rounds to zeros
    got = kernels.quant_linear(x, w.codes, w.scale, w.offset, w.group, w.bits, w.zero, 8)
    assert_float32_accumulation(got, rounded_rows(x) if rows <= 8 else x, w)


@needs_native
def test_bad_shapes_and_rows_are_refused():
    w = random_matrix(8, 64, LAYOUTS[0], 0)
    kernels = load_native()
    with pytest.raises(RuntimeError, match="outside"):
        kernels.dequantize_rows(w.codes, w.scale, None, 32, 4, 8, torch.tensor([8]))
    with pytest.raises(RuntimeError, match="groups of 16 or 32"):
        kernels.quant_linear(torch.randn(1, 64), w.codes, w.scale, None, 16, 4, 8)
    with pytest.raises(RuntimeError, match=r"\[rows, 64\]"):
        kernels.quant_linear(torch.randn(1, 63), w.codes, w.scale, None, 32, 4, 8)


@pytest.mark.parametrize("kind", sorted(FORMATS, key=lambda k: k.name), ids=lambda k: k.name)
def test_the_packed_form_holds_the_repacked_values_exactly(kind):
    from tests.unit.test_quantized import random_blocks

    rng = np.random.default_rng(int(kind))
    raw = random_blocks(kind, 5, 256, rng)
    weight = from_gguf(raw, kind, (5, 256))
    matrix = to_matrix(weight)
    np.testing.assert_array_equal(matrix.dequantize(native=False).numpy(), weight.dequantize())
    assert matrix.shape == (5, 256)
    bits = 4 if kind.name.startswith("Q4") else 8
    assert matrix.bits == bits and matrix.codes.numel() == 5 * 256 * bits // 8


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantize_rounds_each_value_to_its_groups_nearest_step(kind):
    rng = np.random.default_rng(0)
    values = rng.normal(0, 0.05, (16, 128)).astype(np.float32)
    values[3, :32] = 0  # an all-zero group
    weight: QuantizedWeight = quantize(values, kind)
    back = weight.dequantize()
    step = np.repeat(weight.scale, 32, axis=1)
    assert (np.abs(back - values) <= step / 2 * (1 + 1e-5) + 1e-7).all()
    np.testing.assert_array_equal(back[3, :32], 0)
    assert weight.code_bits == ((4, 0) if kind == "int4" else (8, 0))
    np.testing.assert_array_equal(to_matrix(weight).dequantize(native=False).numpy(), back)


@pytest.mark.parametrize("rows", [1, 5, 32, 33, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_quant_linear_takes_either_path_with_the_same_result(rows, bias):
    """Up to ``quant_rows`` from the codes (x rounded to int8 up to ``quant_int8_rows``),
    above through the dequantized weight."""
    w = random_matrix(40, 96, LAYOUTS[1], rows)
    x = torch.randn(rows, 96)
    b = torch.randn(40) if bias else None
    values = w.dequantize(native=False)
    rounded = here().native and rows <= here().quant_int8_rows
    expected = F.linear(rounded_rows(x) if rounded else x, values, b)
    torch.testing.assert_close(quant_linear(x, w, b, here()), expected, rtol=1e-5, atol=1e-5)
    exact = F.linear(x, values, b)
    torch.testing.assert_close(quant_linear(x, w, b, None), exact, rtol=1e-5, atol=1e-5)
    out = quant_linear(x.bfloat16(), w, b, here())
    assert out.dtype == torch.bfloat16  # in the activations' dtype
