"""``nn.Linear`` with faster paths for few rows on the CPU.

A decode step (and each prefill's last token, for the logits) multiplies a handful of rows
by every weight matrix; that is one pass over the weights, and torch's CPU GEMM runs it well
below the machine's rate. Up to ``NATIVE_ROWS`` rows of float32 or bfloat16 go to the
native kernel (``csrc/linear_rows.cpp``), which streams the weights once and overlaps the
stream with the arithmetic: bench-135m's 30 layers at 16 rows took 94 ms with torch and
37-50 ms with it on this project's CPU, its 49k-word output layer 31 -> 13-15 ms
(``radixserve bench kernels`` measures it against the weight-read limit). Without the native
module, float32 up to ``FEW_ROWS`` rows is written weight-first, ``(W @ x.T).T``, which MKL
ran 1.5-2x faster than ``x @ W.T`` here. Larger batches keep ``F.linear``: there the GEMM is
compute-bound and torch's is as good.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.csrc import load_native

NATIVE_ROWS = 32
FEW_ROWS = 128
_NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; a 2-D CPU ``x`` of few rows takes a faster path."""
    if x.device.type != "cpu" or x.dim() != 2 or len(x) > FEW_ROWS:
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return F.linear(x, weight, bias)  # the native kernel has no backward
    if (
        len(x) <= NATIVE_ROWS
        and x.dtype == weight.dtype
        and x.dtype in _NATIVE_DTYPES
        and weight.is_contiguous()
        and (kernels := load_native()) is not None
    ):
        out = kernels.linear_rows(x, weight)
        if bias is not None:
            out.add_(bias)
        return out.to(x.dtype)
    if x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    out = (weight @ x.t()).t().contiguous()
    return out if bias is None else out.add_(bias)


class Linear(nn.Linear):
    """Same parameters and names as ``nn.Linear``, so checkpoints load unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
