"""torch's oneDNN GEMM, called directly through torch's private mkldnn ops (the one place
they are called): it takes weights laid out ahead of time for its kernels, and on some CPUs
multiplies far faster than torch's default BLAS (``CpuProfile`` says where it is used)."""

from __future__ import annotations

import torch

# The batch size oneDNN is told to expect when it lays weights out: a decode step's.
PACK_BATCH_HINT = 32


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


def supports(dtype: torch.dtype) -> bool:
    """Whether oneDNN multiplies ``dtype`` here (bfloat16 needs AVX-512 or AVX-NE-CONVERT;
    a profile pinned on another CPU may ask for it where it cannot run)."""
    if not available():
        return False
    return dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``x @ weight.T (+ bias)`` in oneDNN, ``weight`` plain or laid out by ``pack``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` laid out for oneDNN's kernels (a copy)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
