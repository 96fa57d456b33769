"""The CPU fast paths, in one place: the native kernels' build (``native``, sources in
``csrc/``), oneDNN's GEMM (``onednn``), the linear-layer paths (``linear``), the fused
elementwise steps (``elementwise``), the paged kernel's work lists (``paged_plan``), dense
attention blocks (``dense_blocks``), the decode step's native layer loop
(``decode_layers``), and the ``CpuProfile`` that decides among them once per process
(``profile``); and the OpenMP waiting policy the command line starts torch with
(``openmp``, which loads no torch).

``model/`` and ``attention/`` say what they compute and receive a profile from the model
runner; nothing else here probes the machine or times a kernel to choose one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixserve.cpu.profile import (
        CpuFeatures,
        CpuProfile,
        DtypePaths,
        load_profile,
        probe_cpu_profile,
    )

__all__ = ["CpuFeatures", "CpuProfile", "DtypePaths", "load_profile", "probe_cpu_profile"]


def __getattr__(name: str):
    # The profile loads torch; ``openmp`` (the command line's, read before torch) does not.
    if name in __all__:
        from radixserve.cpu import profile

        return getattr(profile, name)
    raise AttributeError(f"module 'radixserve.cpu' has no attribute {name!r}")
