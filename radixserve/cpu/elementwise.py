"""The decoder's elementwise steps, each one native pass on the CPU (``csrc/elementwise.cpp``)
and the same operations in torch elsewhere (the twin the tests compare it with).

torch runs RMSNorm as seven operations and RoPE as six, each a pass over the activations,
and on a decode step their dispatches add up. Rounding follows transformers' order in both
versions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixserve.cpu.native import load_native

FUSED_DTYPES = (torch.float32, torch.bfloat16)


def _kernels(x: torch.Tensor):
    if x.device.type != "cpu" or x.dtype not in FUSED_DTYPES or torch.is_grad_enabled():
        return None
    return load_native()


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """``weight * rms_norm(x)``; given ``residual``, first ``residual += x`` (in place) and
    the norm of the sum."""
    if (kernels := _kernels(x)) is not None and weight.dtype == x.dtype:
        return kernels.add_rms_norm(x, residual, weight, eps)
    if residual is not None:
        x = residual.add_(x)
    # Normalise in float32, scale in the input dtype: transformers' order of rounding.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, SiLU rounded to the dtype before the product (as torch's two
    operations round)."""
    kernels = _kernels(gate)
    if kernels is not None and gate.dim() == 2:
        return kernels.silu_mul(gate, up)
    return F.silu(gate) * up


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[num_tokens, heads, head_dim]``) by pairing its two halves, in place
    where the native kernel runs; returns the rotated tensor."""
    if (kernels := _kernels(x)) is not None and x.stride(1) == x.shape[2]:
        kernels.rope_inplace(x, cos, sin)
        return x
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
