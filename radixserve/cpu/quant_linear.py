"""Linear layers and embeddings on quantized weights, kept quantized in memory.

A ``QuantMatrix`` is the form ``csrc/quant_linear.cpp`` streams: integer codes (4-bit ones
two to a byte) with a scale and offset per group of a row, float16 where every one of them
is a float16 (GGUF's Q4_0/Q4_1/Q8_0 store theirs so), else float32. Few rows (a decode step)
multiply straight from the codes, 4-bit ones with activations rounded to int8 per group of
32 up to ``CpuProfile.quant_int8_rows`` (``csrc/quant_int8.cpp``: llama.cpp's trade; off by
default: it costs accuracy). More rows (a prefill) dequantize the weight to float32 and take
the float GEMM the profile picks for float32 weights (oneDNN's where torch's BLAS is the
slower), whose cost there is the multiply-adds, not the weight's bytes. Where the native
kernels are not built, the same products run in torch on the dequantized weight,
which is also every path's reference twin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from radixserve.cpu import onednn
from radixserve.cpu.native import load_native
from radixserve.cpu.profile import CpuProfile


@dataclass(frozen=True, eq=False)
class QuantMatrix:
    """An ``out x in`` weight: ``value = scale * (code - zero) + offset`` by group of a row.
    ``codes``: uint8 ``[out, in * bits / 8]`` (8-bit codes as int8 bits; 4-bit ones with
    value ``i`` of a group in byte ``i``'s low nibble and ``i + group / 2`` in its high
    one); ``scale``, ``offset``: ``[out, in / group]``, both float16 or both float32
    (``offset`` None: zero)."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None
    group: int
    bits: int
    zero: int
    source: str  # the format it came from: a GGUF type, "int8", "int4"

    @classmethod
    def pack(
        cls,
        codes: np.ndarray,
        scale: np.ndarray,
        offset: np.ndarray | None,
        group: int,
        bits: int,
        zero: int,
        source: str,
    ) -> QuantMatrix:
        """From signed codes (int8 ``[out, in]``, each ``code - zero`` of the form above)."""
        rows, cols = codes.shape
        if bits == 4:
            nibbles = (codes.astype(np.int16) + zero).astype(np.uint8)
            if nibbles.max(initial=0) > 15 or (codes.astype(np.int16) + zero).min(initial=0) < 0:
                raise ValueError(f"{source}: codes do not fit 4 bits with zero {zero}")
            halves = nibbles.reshape(rows, cols // group, 2, group // 2)
            packed = halves[:, :, 0] | (halves[:, :, 1] << 4)
        elif bits == 8:
            packed = (codes.astype(np.int16) + zero).astype(np.int8).view(np.uint8)
        else:
            raise ValueError(f"codes of {bits} bits are not supported (4, 8)")

        def tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(dtype).contiguous()

        floats = [a for a in (scale, offset) if a is not None]
        exact = all(np.array_equal(a.astype(np.float16).astype(a.dtype), a) for a in floats)
        kind = torch.float16 if exact else torch.float32
        return cls(
            tensor(packed.reshape(rows, -1), torch.uint8),
            tensor(scale, kind),
            None if offset is None else tensor(offset, kind),
            group,
            bits,
            zero,
            source,
        )

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * 8 // self.bits

    @property
    def nbytes(self) -> int:
        parts = (self.codes, self.scale, self.offset)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    @classmethod
    def concat(cls, parts: list[QuantMatrix]) -> QuantMatrix:
        """One weight of ``parts``' rows, in order (they share a layout: ``same_layout``)."""
        first = parts[0]
        offset = None if first.offset is None else torch.cat([p.offset for p in parts])
        return cls(
            torch.cat([p.codes for p in parts]),
            torch.cat([p.scale for p in parts]),
            offset,
            first.group,
            first.bits,
            first.zero,
            first.source,
        )

    def same_layout(self, other: QuantMatrix) -> bool:
        def layout(m: QuantMatrix) -> tuple:
            return m.group, m.bits, m.zero, m.offset is None, m.scale.dtype, m.shape[1]

        return layout(self) == layout(other)

    def row_range(self, start: int, stop: int) -> QuantMatrix:
        """Rows ``start:stop`` as views (contiguous: rows are)."""
        offset = None if self.offset is None else self.offset[start:stop]
        return QuantMatrix(
            self.codes[start:stop],
            self.scale[start:stop],
            offset,
            self.group,
            self.bits,
            self.zero,
            self.source,
        )

    def dequantize(self, rows: torch.Tensor | None = None, native: bool = True) -> torch.Tensor:
        """float32 values of rows ``rows`` (None: all); ``native=False``: the torch twin."""
        if native and load_native() is not None:
            return load_native().dequantize_rows(*self._args(), rows)
        codes = self.codes if rows is None else self.codes[rows]
        scale = self.scale if rows is None else self.scale[rows]
        if self.bits == 4:
            n, g = len(codes), self.group
            halves = codes.reshape(n, -1, 1, g // 2) >> torch.tensor([0, 4]).view(1, 1, 2, 1)
            ints = (halves & 15).reshape(n, -1).to(torch.int32)
        else:
            ints = codes.view(torch.int8).to(torch.int32)
        grouped = (ints - self.zero).float().reshape(len(ints), -1, self.group)
        values = grouped * scale.float().unsqueeze(-1)
        if self.offset is not None:
            offset = self.offset if rows is None else self.offset[rows]
            values = values + offset.float().unsqueeze(-1)
        return values.reshape(len(ints), -1)

    def _args(self) -> tuple:
        return self.codes, self.scale, self.offset, self.group, self.bits, self.zero


def quant_linear(
    x: torch.Tensor,
    weight: QuantMatrix,
    bias: torch.Tensor | None,
    profile: CpuProfile | None,
) -> torch.Tensor:
    """``F.linear(x, weight's values, bias)`` in ``x``'s dtype, on the path for its rows."""
    native = profile is not None and profile.native and x.device.type == "cpu"
    if native and x.dim() == 2 and len(x) <= profile.quant_rows:
        out = load_native().quant_linear(x, *weight._args(), profile.quant_int8_rows)
        if bias is not None:
            out.add_(bias)
    else:
        values = weight.dequantize(native=native)
        can_onednn = native and x.dim() == 2 and onednn.supports(torch.float32)
        onednn_rows = profile.float32.onednn_rows if can_onednn else None
        if onednn_rows is not None and len(x) >= onednn_rows:
            out = onednn.linear(x.float(), values, bias)
        else:
            out = F.linear(x.float(), values, bias)
    return out.to(x.dtype)


class QuantizedLinear(nn.Module):
    """A projection whose weight stays quantized; ``bias`` (if any) stays a float
    ``Parameter`` under ``Linear``'s name."""

    def __init__(self, weight: QuantMatrix, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.quant = weight
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    profile: CpuProfile | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_linear(x, self.quant, self.bias, self.profile)

    def extra_repr(self) -> str:
        q = self.quant
        return f"in={self.in_features}, out={self.out_features}, {q.source}, group={q.group}"


class FusedQuantLinear:
    """``QuantizedLinear``s over one input (q, k and v; gate and up) as one product where few
    rows take the codes, as ``FusedLinear`` does for float ones. The parts' codes, scales
    and offsets are concatenated and each part's become views of its rows."""

    def __init__(self, parts: list[QuantizedLinear], profile: CpuProfile) -> None:
        if not fusable(parts):
            raise ValueError("fused quantized projections need one layout and bias on all or none")
        self.parts, self.sizes = list(parts), [p.out_features for p in parts]
        self.profile = profile
        self.quant = QuantMatrix.concat([p.quant for p in parts])
        self.bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
        rows = 0
        for p, n in zip(parts, self.sizes, strict=True):
            p.quant = self.quant.row_range(rows, rows + n)
            if self.bias is not None:
                p.bias.data = self.bias[rows : rows + n]
            rows += n

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each part's output: views of one product's columns, or the parts' own."""
        if self.profile.native and x.dim() == 2 and len(x) <= self.profile.quant_rows:
            return quant_linear(x, self.quant, self.bias, self.profile).split(self.sizes, -1)
        return [p(x) for p in self.parts]


def fusable(parts: list[nn.Module]) -> bool:
    """Whether ``parts`` are quantized projections ``FusedQuantLinear`` can join."""
    if not all(isinstance(p, QuantizedLinear) for p in parts):
        return False
    first = parts[0]
    return all(
        p.quant.same_layout(first.quant) and (p.bias is None) == (first.bias is None) for p in parts
    )


class QuantizedEmbedding(nn.Module):
    """Token embeddings kept quantized: a lookup dequantizes the rows it reads."""

    def __init__(self, weight: QuantMatrix, dtype: torch.dtype) -> None:
        super().__init__()
        self.quant, self.dtype = weight, dtype
        self.num_embeddings, self.embedding_dim = weight.shape

    profile: CpuProfile | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        native = self.profile is not None and self.profile.native
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        return self.quant.dequantize(flat, native=native).to(self.dtype).reshape(*ids.shape, -1)
