"""``nn.Linear`` with the CPU's faster paths, chosen by row count from a ``CpuProfile``.

A decode step (and each prefill's last token, for the logits) multiplies a handful of rows
by every weight matrix: one pass over the weights, which torch's CPU GEMM runs well below
the machine's rate. The paths, by rows ``n`` of the input (bounds in ``DtypePaths``):

- a weight packed in column panels (``csrc/panel_linear.cpp``): ``n <= panel_rows``;
- a weight in oneDNN's blocked layout (``onednn.py``): ``n >= onednn_rows``;
- a plain weight streamed once by the native row kernel (``csrc/linear_rows.cpp``, which
  also widens bfloat16 in registers): ``n <= native_rows``;
- float32 weight-first, ``(W @ x.T).T``, which MKL runs faster for few rows:
  ``n <= few_rows``;
- otherwise torch's ``F.linear``, which is also every path's reference twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.cpu import onednn
from radixserve.cpu.native import load_native
from radixserve.cpu.profile import CpuProfile


@dataclass(frozen=True)
class PackedWeight:
    """A weight again in the layouts its faster paths read (``pack``); None where absent."""

    panels: torch.Tensor | None
    onednn: torch.Tensor | None

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (self.panels, self.onednn) if t is not None
        )


def cpu_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    profile: CpuProfile | None,
    packed: PackedWeight | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on the path ``profile`` gives ``x``'s rows."""
    paths = profile.paths(x.dtype) if profile is not None else None
    if (
        paths is None
        or x.device.type != "cpu"
        or x.dim() != 2
        or x.dtype != weight.dtype
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        return F.linear(x, weight, bias)  # the native kernels have no backward
    rows = len(x)
    if packed is not None:
        if packed.panels is not None and rows <= paths.panel_rows:
            return _on_panels(x, packed, weight.shape[0], bias)
        if packed.onednn is not None and rows >= paths.onednn_rows:
            return onednn.linear(x, packed.onednn, bias)
    if rows <= paths.native_rows and profile.native and weight.is_contiguous():
        out = load_native().linear_rows(x, weight)
        if bias is not None:
            out.add_(bias)
        return out.to(x.dtype)
    if x.dtype == torch.float32 and rows <= profile.few_rows:
        out = (weight @ x.t()).t().contiguous()
        return out if bias is None else out.add_(bias)
    return F.linear(x, weight, bias)


def _on_panels(
    x: torch.Tensor, packed: PackedWeight, out_features: int, bias: torch.Tensor | None
) -> torch.Tensor:
    out = load_native().panel_linear(x, packed.panels, out_features)
    return out if bias is None else out.add_(bias)


class Linear(nn.Linear):
    """Same parameters and names as ``nn.Linear``, so checkpoints load unchanged.
    ``profile``: the paths it takes (None: torch's ``F.linear``); ``packed``: its weight
    again in their layouts; ``fused``: its weight is rows of a ``FusedLinear``'s, whose
    panels serve its few-row products (its own pack is oneDNN's layout alone)."""

    profile: CpuProfile | None = None
    packed: PackedWeight | None = None
    fused: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_linear(x, self.weight, self.bias, self.profile, self.packed)


class FusedLinear:
    """``Linear``s over one input (a layer's q, k and v; gate and up) as one product where
    few rows take the panels: one call instead of several small ones. More rows take each
    part's own path, so their outputs stay contiguous for the elementwise kernels after
    them. The weights are concatenated and each part's weight becomes a view of its rows:
    nothing is stored twice."""

    def __init__(self, parts: Sequence[Linear], profile: CpuProfile) -> None:
        if len({p.bias is None for p in parts}) != 1:
            raise ValueError("fused projections need a bias on all of them or on none")
        self.parts, self.sizes = list(parts), [p.out_features for p in parts]
        self.profile = profile
        self.weight = torch.cat([p.weight.detach() for p in parts])
        self.bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
        rows = 0
        for p, n in zip(parts, self.sizes, strict=True):
            p.weight.data = self.weight[rows : rows + n]
            if self.bias is not None:
                p.bias.data = self.bias[rows : rows + n]
            p.fused = True
            rows += n
        self.packed = pack(self.weight, profile, blocked=False)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each part's output: views of one product's columns, or the parts' own."""
        if takes_panels(x, self.weight, self.packed, self.profile):
            out = _on_panels(x, self.packed, len(self.weight), self.bias)
            return out.split(self.sizes, -1)
        return [p(x) for p in self.parts]


def takes_panels(
    x: torch.Tensor, weight: torch.Tensor, packed: PackedWeight | None, profile: CpuProfile
) -> bool:
    """Whether ``x`` times ``weight`` runs on ``packed``'s column panels."""
    paths = profile.paths(x.dtype)
    return (
        paths is not None
        and packed is not None
        and packed.panels is not None
        and x.dim() == 2
        and x.dtype == weight.dtype
        and not torch.is_grad_enabled()
        and len(x) <= paths.panel_rows
    )


def pack(
    weight: torch.Tensor, profile: CpuProfile, panels: bool = True, blocked: bool = True
) -> PackedWeight | None:
    """``weight`` in the layouts the profile gives its dtype (those asked for), or None."""
    paths = profile.paths(weight.dtype)
    if weight.device.type != "cpu" or paths is None:
        return None
    with_panels = panels and profile.native and paths.panel_rows > 0
    panel_weight = load_native().pack_panels(weight.detach()) if with_panels else None
    with_onednn = blocked and paths.onednn_rows is not None and onednn.supports(weight.dtype)
    onednn_weight = onednn.pack(weight) if with_onednn else None
    if panel_weight is None and onednn_weight is None:
        return None
    return PackedWeight(panel_weight, onednn_weight)


def use_profile(model: nn.Module, profile: CpuProfile, packed: bool) -> int:
    """Give every ``Linear`` of ``model`` the profile's paths, and with ``packed`` its weight
    again in their layouts (a fused part's panels are its ``FusedLinear``'s); returns the
    bytes packing added (up to two more copies of the weights)."""
    added = 0
    for m in model.modules():
        if not isinstance(m, Linear):
            continue
        m.profile = profile
        if packed and (p := pack(m.weight, profile, panels=not m.fused)) is not None:
            m.packed = p
            added += p.nbytes
    return added
