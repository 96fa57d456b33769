"""GGUF's block formats repacked into codes, scales and offsets: every value equals the
``gguf`` package's dequantization of the same bytes, bit for bit, for blocks of random bits
(every code, scale and sign pattern a file can hold) and for weights ``gguf`` quantized."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from radixserve.model.quantized import FORMATS, from_gguf
from tests.real_model import real_model_file

__all__ = ["real_model_file"]  # a fixture

KINDS = sorted(FORMATS, key=lambda k: k.name)


def random_blocks(kind, rows: int, cols: int, rng) -> np.ndarray:
    """Random bytes in ``kind``'s block layout, its float16 fields finite."""
    block, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    halves = {  # byte offsets of each block's float16 fields
        GGMLQuantizationType.Q6_K: (208,),
        GGMLQuantizationType.Q8_0: (0,),
        GGMLQuantizationType.Q4_0: (0,),
        GGMLQuantizationType.Q5_0: (0,),
    }.get(kind, (0, 2))
    for at in halves:
        raw[:, at : at + 2] = rng.normal(0, 0.05, (len(raw), 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_random_blocks_dequantize_bit_for_bit_as_gguf_does(kind):
    rng = np.random.default_rng(int(kind))
    rows, cols = 6, 512
    raw = random_blocks(kind, rows, cols, rng)
    weight = from_gguf(raw, kind, (rows, cols))
    expected = dequantize(raw, kind).reshape(rows, cols)
    got = weight.dequantize()
    assert got.dtype == np.float32 and got.shape == (rows, cols)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert weight.codes.dtype == np.int8 and weight.source == kind.name
    assert weight.nbytes < 4 * rows * cols  # smaller than float32, kept that way


@pytest.mark.parametrize(
    "kind", [k for k in KINDS if k.name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")]
)
def test_weights_gguf_quantized_come_back_as_its_dequantization(kind):
    rng = np.random.default_rng(1)
    values = rng.normal(0, 0.02, (8, 256)).astype(np.float32)
    raw = quantize(values, kind)
    got = from_gguf(raw, kind, values.shape).dequantize()
    np.testing.assert_array_equal(got, dequantize(raw, kind).reshape(values.shape))
    assert np.abs(got - values).max() < 0.02  # and it is a quantization of the weight


def test_the_real_models_q4_1_tensors_repack_exactly(real_model_file):
    from gguf import GGUFReader

    reader = GGUFReader(real_model_file)
    checked = 0
    for tensor in reader.tensors:
        if tensor.tensor_type not in FORMATS or checked >= 4:
            continue
        cols, rows = (int(n) for n in tensor.shape[:2])
        weight = from_gguf(tensor.data, tensor.tensor_type, (rows, cols))
        expected = dequantize(tensor.data, tensor.tensor_type).reshape(rows, cols)
        np.testing.assert_array_equal(weight.dequantize(), expected)
        checked += 1
    assert checked == 4


def test_formats_it_does_not_keep_and_bad_shapes_are_refused():
    raw = np.zeros((2, 18), np.uint8)
    with pytest.raises(ValueError, match="not one the engine keeps"):
        from_gguf(raw, GGMLQuantizationType.F16, (2, 16))
    with pytest.raises(ValueError, match="not whole blocks"):
        from_gguf(raw, GGMLQuantizationType.Q4_0, (2, 48))
    with pytest.raises(ValueError, match="blocks for a"):
        from_gguf(raw, GGMLQuantizationType.Q4_0, (4, 32))
