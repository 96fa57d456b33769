"""Quantized weights kept quantized: GGUF's blocks repacked, losslessly, into one form.

Every block format the engine takes decodes the same way: a value is a group's ``scale``
times an integer ``code`` plus the group's ``offset`` (zero for the symmetric formats).
GGUF spells that out per format (two nibbles a byte, a fifth or sixth bit stored apart,
K-quants' super-blocks with 6-bit sub-block scales and minimums); here each format's bits
are unpacked once, at load, into int8 codes by row plus float32 scales and offsets by group,
which is what a kernel streams. The scales and offsets are the very float32 products GGUF's
reference dequantization forms (``d * sc``, ``dmin * m``), so ``dequantize()`` yields the
file's values bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
QUANTIZE_KINDS = ("int8", "int4")  # what ``quantize`` makes of a float weight
QUANTIZE_GROUP = 32
Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # codes, scales, offsets


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A ``rows x cols`` weight: ``codes`` (int8, ``rows x cols``), ``scale`` and ``offset``
    (float32, ``rows x cols / group``; ``offset`` None for symmetric formats)."""

    codes: np.ndarray
    scale: np.ndarray
    offset: np.ndarray | None
    group: int
    source: str  # the GGUF format it came from

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    @property
    def nbytes(self) -> int:
        extra = 0 if self.offset is None else self.offset.nbytes
        return self.codes.nbytes + self.scale.nbytes + extra

    @property
    def code_bits(self) -> tuple[int, int]:
        """``(bits, zero)``: the width its codes take in the kernels' form and what makes
        them unsigned there (4-bit formats go two to a byte)."""
        if self.source in ("Q4_0", "Q4_1", "Q4_K", "int4"):
            return 4, 8 if self.source == "Q4_0" else 0
        return 8, 0

    def dequantize(self) -> np.ndarray:
        """The float32 values: ``scale * code + offset`` group by group, in that order."""
        rows, cols = self.shape
        codes = self.codes.reshape(rows, cols // self.group, self.group).astype(np.float32)
        values = self.scale[..., None] * codes
        if self.offset is not None:
            values = values + self.offset[..., None]
        return values.reshape(rows, cols)


def from_gguf(data: np.ndarray, kind: int, shape: tuple[int, int]) -> QuantizedWeight:
    """Repack a GGUF tensor's raw blocks (``data``: its bytes, as the reader gives them) of
    a ``rows x cols`` weight."""
    kind = Q(kind)
    if kind not in FORMATS:
        raise ValueError(f"GGUF type {kind.name} is not one the engine keeps quantized")
    block, size = GGML_QUANT_SIZES[kind]
    rows, cols = shape
    if cols % block:
        raise ValueError(f"{kind.name}: a row of {cols} is not whole blocks of {block}")
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, size)
    if len(blocks) != rows * cols // block:
        raise ValueError(f"{kind.name}: {len(blocks)} blocks for a {rows} x {cols} weight")
    unpack, group = FORMATS[kind]
    codes, scale, offset = unpack(blocks)
    return QuantizedWeight(
        codes.reshape(rows, cols),
        scale.reshape(rows, cols // group),
        None if offset is None else offset.reshape(rows, cols // group),
        group,
        kind.name,
    )


def quantize(weight: np.ndarray, kind: str, group: int = QUANTIZE_GROUP) -> QuantizedWeight:
    """A float ``rows x cols`` weight quantized by groups of ``group`` along its rows:
    ``int8`` symmetric (scale ``max|w| / 127``), ``int4`` with minimums (scale
    ``(max - min) / 15``, offset ``min``), codes rounded to nearest."""
    if kind not in QUANTIZE_KINDS:
        raise ValueError(f"quantize takes {' or '.join(QUANTIZE_KINDS)}, not {kind!r}")
    rows, cols = weight.shape
    if cols % group:
        raise ValueError(f"a row of {cols} is not whole groups of {group}")
    g = np.asarray(weight, np.float32).reshape(rows, cols // group, group)
    if kind == "int8":
        scale, offset, top = np.abs(g).max(-1) / np.float32(127), None, 127
        low = -127
    else:
        offset, top, low = g.min(-1), 15, 0
        scale = (g.max(-1) - offset) / np.float32(15)
    scale = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    shifted = g if offset is None else g - offset[..., None]
    codes = np.clip(np.rint(shifted / scale[..., None]), low, top).astype(np.int8)
    return QuantizedWeight(codes.reshape(rows, cols), scale, offset, group, kind)


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(raw: np.ndarray, run: int) -> np.ndarray:
    """Runs of ``run`` bytes: the low nibbles' ``run`` values, then the high nibbles'."""
    n = raw.shape[0]
    r = raw.reshape(n, -1, 1, run) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (r & 0x0F).reshape(n, -1)


def _bits(raw: np.ndarray, count: int) -> np.ndarray:
    """Bit ``i`` of a little-endian bit field, for ``i < count``."""
    return np.unpackbits(raw, axis=1, count=count, bitorder="little")


def _q8_0(b: np.ndarray) -> Unpacked:
    return b[:, 2:].view(np.int8), _f16(b[:, :2]), None


def _q4_0(b: np.ndarray) -> Unpacked:
    return _nibbles(b[:, 2:], 16).astype(np.int8) - 8, _f16(b[:, :2]), None


def _q4_1(b: np.ndarray) -> Unpacked:
    return _nibbles(b[:, 4:], 16).astype(np.int8), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q5_0(b: np.ndarray) -> Unpacked:
    high = _bits(b[:, 2:6], 32) << 4
    return (_nibbles(b[:, 6:], 16) | high).astype(np.int8) - 16, _f16(b[:, :2]), None


def _q5_1(b: np.ndarray) -> Unpacked:
    high = _bits(b[:, 4:8], 32) << 4
    return (_nibbles(b[:, 8:], 16) | high).astype(np.int8), _f16(b[:, :2]), _f16(b[:, 2:4])


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: the 8 sub-blocks' scale factors ``d * sc`` and minimums ``dmin * m``
    (6-bit ``sc`` and ``m``, packed into 12 bytes)."""
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    s = b[:, 4:16].reshape(-1, 3, 4)
    lo, mid, top = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=1)
    m = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=1)
    return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _q4_k(b: np.ndarray) -> Unpacked:
    scale, offset = _k_scales(b)
    return _nibbles(b[:, 16:], 32).astype(np.int8), scale, offset


def _q5_k(b: np.ndarray) -> Unpacked:
    scale, offset = _k_scales(b)
    n = b.shape[0]
    # bit j of high byte i is the fifth bit of sub-block j's value i
    high = (b[:, None, 16:48] >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    low = _nibbles(b[:, 48:], 32).reshape(n, 8, 32)
    return (low | (high << 4)).astype(np.int8).reshape(n, -1), scale, offset


def _q6_k(b: np.ndarray) -> Unpacked:
    n = b.shape[0]
    low = _nibbles(b[:, :128], 64).reshape(n, -1, 32)
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    high = ((b[:, 128:192].reshape(n, -1, 1, 32) >> shifts) & 0x03).reshape(n, -1, 32)
    codes = (low | (high << 4)).astype(np.int8) - 32
    scale = _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32)
    return codes.reshape(n, -1), scale, None


FORMATS: dict[GGMLQuantizationType, tuple[Callable[[np.ndarray], Unpacked], int]] = {
    Q.Q8_0: (_q8_0, 32),
    Q.Q4_0: (_q4_0, 32),
    Q.Q4_1: (_q4_1, 32),
    Q.Q5_0: (_q5_0, 32),
    Q.Q5_1: (_q5_1, 32),
    Q.Q4_K: (_q4_k, 32),
    Q.Q5_K: (_q5_k, 32),
    Q.Q6_K: (_q6_k, 16),
}
