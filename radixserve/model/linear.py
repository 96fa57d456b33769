"""``nn.Linear`` with faster paths on the CPU.

A decode step (and each prefill's last token, for the logits) multiplies a handful of rows
by every weight matrix; that is one pass over the weights, and torch's CPU GEMM runs it well
below the machine's rate. Up to ``NATIVE_ROWS`` rows of float32 go to the native kernel
(``csrc/linear_rows.cpp``), which streams the weights once and overlaps the stream with the
arithmetic: bench-135m's 30 layers at 16 rows took 85-98 ms with torch and ~50 ms with it
on this project's CPU (``radixserve bench kernels`` measures it against the weight-read
limit). It stays ahead up to ~48 rows (0.79-0.88x torch's time from 32 to 48 rows, 0.96x at
64, on AVX-512): a prompt's short suffix beside a few decodes is such a step. Larger
batches keep torch's GEMM.
bfloat16 goes native at every size on a CPU without bfloat16 instructions, where torch's
bfloat16 GEMM ran 3.6-4.2x slower than the kernel (which widens the weights in registers)
from 16 to 2048 rows; where the CPU has them (AVX512_BF16, AMX), torch's GEMM is the fast
one (a 2048-token prefill ran 6x faster with it) and only up to ``NATIVE_BF16_ROWS`` rows
go native. Without the native module, float32 up to ``FEW_ROWS`` rows is written
weight-first, ``(W @ x.T).T``, which MKL ran 1.5-2x faster than ``x @ W.T`` here.

Which library multiplies fastest depends on the CPU, not only on its instructions: on an
AMD EPYC with AVX-512, torch's float32 GEMM (MKL) ran bench-135m's projections at 155-180
GFLOP/s where oneDNN on packed weights ran ~410, so a ``Linear`` may hold its weight again
in oneDNN's layout (``pack_weights``) for the batches where that is the faster path. At a
decode step's few dozen rows both that and the native kernel above ran at 150-200 GFLOP/s
there, a third of the machine's rate; a float32 weight packed into column panels
(``csrc/panel_linear.cpp``) ran the projections at 20 rows in 15-17 ms against 24-27 (both)
and at 32 rows in 22-26 against 31-35 (oneDNN), so up to ``PANEL_MAX_ROWS`` rows take it.
With AVX512_BF16, bfloat16 panels (multiplied by its pairwise dot products) ran them at 32
rows in 11.6 ms against oneDNN's 17.3, and still ahead at 192 rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.csrc import load_native, onednn, torch_has_bf16_instructions

NATIVE_ROWS = 48
NATIVE_BF16_ROWS = 8
FEW_ROWS = 128
BF16_GEMM = torch_has_bf16_instructions()
# Rows from which a packed weight beats the native kernel on bench-135m's projections:
# bfloat16 14.4 ms against 13.0 at 4 rows, 13.8 against 15.1 at 8; float32 (AMD EPYC, bench
# kernels) 26.4 against 23.9 at 16 rows, 32.0 against 34.2 at 24, 35.6 against 46.2 at 32.
PACKED_MIN_ROWS = {torch.bfloat16: 5, torch.float32: 24}
# Rows up to which panels beat oneDNN's packed GEMM (AMD EPYC: float32 ~96, bfloat16 ~256).
PANEL_MAX_ROWS = {torch.bfloat16: 128, torch.float32: 64}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; a 2-D CPU ``x`` takes a faster path where one exists."""
    if x.device.type != "cpu" or x.dim() != 2:
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return F.linear(x, weight, bias)  # the native kernel has no backward
    if _native_pays(x, weight) and (kernels := load_native()) is not None:
        out = kernels.linear_rows(x, weight)
        if bias is not None:
            out.add_(bias)
        return out.to(x.dtype)
    if x.dtype != torch.float32 or len(x) > FEW_ROWS:
        return F.linear(x, weight, bias)
    out = (weight @ x.t()).t().contiguous()
    return out if bias is None else out.add_(bias)


def _native_pays(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if x.dtype != weight.dtype or not weight.is_contiguous():
        return False
    if x.dtype == torch.bfloat16:
        return not BF16_GEMM or len(x) <= NATIVE_BF16_ROWS
    return x.dtype == torch.float32 and len(x) <= NATIVE_ROWS


@dataclass(frozen=True)
class PackedWeight:
    """A weight again in the layouts its faster paths read (``pack``): the native kernel's
    column panels (``csrc/panel_linear.cpp``) for up to ``PANEL_MAX_ROWS`` rows, and oneDNN's
    blocked layout where its GEMM outruns torch's for more; None where absent."""

    panels: torch.Tensor | None
    onednn: torch.Tensor | None

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (self.panels, self.onednn) if t is not None
        )


class Linear(nn.Linear):
    """Same parameters and names as ``nn.Linear``, so checkpoints load unchanged. ``packed``:
    the weight again in its fast paths' layouts (``pack_weights``), or None; ``fused``: its
    weight is rows of a ``FusedLinear``'s, whose panels serve its few-row products (its own
    pack is oneDNN's layout alone)."""

    packed: PackedWeight | None = None
    fused: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.packed, self.bias)


def packed_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    packed: PackedWeight | None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``linear(x, weight, bias)``, on a layout of ``packed`` for the row counts where that
    is the faster path."""
    if packed is None or x.dim() != 2 or x.dtype != weight.dtype or torch.is_grad_enabled():
        return linear(x, weight, bias)
    if takes_panels(x, packed):
        return _on_panels(x, packed, weight.shape[0], bias)
    if packed.onednn is not None and len(x) >= PACKED_MIN_ROWS[x.dtype]:
        return onednn.linear(x, packed.onednn, bias)
    return linear(x, weight, bias)


def _on_panels(
    x: torch.Tensor, packed: PackedWeight, out_features: int, bias: torch.Tensor | None
) -> torch.Tensor:
    out = load_native().panel_linear(x, packed.panels, out_features)
    return out if bias is None else out.add_(bias)


def takes_panels(x: torch.Tensor, packed: PackedWeight | None) -> bool:
    """Whether ``packed_linear`` multiplies ``x`` on ``packed``'s panels (a few rows)."""
    return (
        packed is not None
        and packed.panels is not None
        and x.dim() == 2
        and not torch.is_grad_enabled()
        and len(x) <= PANEL_MAX_ROWS[x.dtype]
    )


class FusedLinear:
    """``Linear``s over one input (a layer's q, k and v; gate and up) as one product where
    few rows take the panels: one call where there were several, each of a decode step's
    small products having paid a call's overhead (``bench kernels``' fused column: a step's
    projections 1.03-1.14x faster). More rows take each part's own path: their outputs stay
    contiguous, as the elementwise kernels after them read fastest (SiLU x up over a fused
    1,088-row result's halves took 0.77 ms against 0.50). The weights are concatenated and
    each part's weight becomes a view of its rows, so nothing is stored twice; the parts
    keep their oneDNN layouts (``pack_weights``), the panels are the fused weight's alone."""

    def __init__(self, parts: Sequence[Linear]) -> None:
        if len({p.bias is None for p in parts}) != 1:
            raise ValueError("fused projections need a bias on all of them or on none")
        self.parts, self.sizes = list(parts), [p.out_features for p in parts]
        self.weight = torch.cat([p.weight.detach() for p in parts])
        self.bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
        rows = 0
        for p, n in zip(parts, self.sizes, strict=True):
            p.weight.data = self.weight[rows : rows + n]
            if self.bias is not None:
                p.bias.data = self.bias[rows : rows + n]
            p.fused = True
            rows += n
        self.packed = pack(self.weight, blocked=False)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each part's output: views of one product's columns, or the parts' own."""
        if x.dtype == self.weight.dtype and takes_panels(x, self.packed):
            out = _on_panels(x, self.packed, len(self.weight), self.bias)
            return out.split(self.sizes, -1)
        return [p(x) for p in self.parts]


def pack(weight: torch.Tensor, panels: bool = True, blocked: bool = True) -> PackedWeight | None:
    """``weight`` in the layouts of its faster paths on this CPU (those asked for), or None
    where it has none: panels for float32 where the native kernels build (and bfloat16
    where they have AVX512_BF16's dot products), oneDNN's where ``can_pack``."""
    if weight.device.type != "cpu":
        return None
    kernels = load_native()
    with_panels = panels and kernels is not None
    if with_panels and weight.dtype == torch.bfloat16:
        with_panels = kernels.bf16_dot()
    elif with_panels:
        with_panels = weight.dtype == torch.float32
    panel_weight = kernels.pack_panels(weight.detach()) if with_panels else None
    onednn_weight = onednn.pack(weight) if blocked and can_pack(weight.dtype) else None
    if panel_weight is None and onednn_weight is None:
        return None
    return PackedWeight(panel_weight, onednn_weight)


def can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN here multiplies ``dtype`` faster than torch's plain GEMM: bfloat16 on
    bfloat16 instructions (AMX, AVX512_BF16), float32 where a probe finds it clearly ahead."""
    if not onednn.available():
        return False
    if dtype == torch.bfloat16:
        return BF16_GEMM
    return dtype == torch.float32 and onednn.float32_faster()


def pack_weights(model: nn.Module) -> int:
    """Give every CPU ``Linear`` of ``model`` its weight again in its faster paths' layouts
    (``pack``); returns the bytes that adds (up to two more copies of those weights).

    bfloat16 on a CPU with AMX: bench-135m's projections ran 1.3-1.9x faster packed than
    through ``F.linear`` from 8 to 256 rows and 1.18x at 2,048, with the same results."""
    added = 0
    for m in model.modules():  # a fused part's panels are its FusedLinear's
        if isinstance(m, Linear) and (packed := pack(m.weight, panels=not m.fused)) is not None:
            m.packed = packed
            added += packed.nbytes
    return added
