"""The CPU fast paths, in one place: the native kernels' build (``native``, sources in
``csrc/``), oneDNN's GEMM (``onednn``), the linear-layer paths (``linear``), the fused
elementwise steps (``elementwise``), the paged kernel's work lists (``paged_plan``), dense
attention blocks (``dense_blocks``), the decode step's native layer loop
(``decode_layers``), and the ``CpuProfile`` that decides among them once per process
(``profile``).

``model/`` and ``attention/`` say what they compute and receive a profile from the model
runner; nothing else here probes the machine or times a kernel to choose one.
"""

from radixserve.cpu.profile import (
    CpuFeatures,
    CpuProfile,
    DtypePaths,
    load_profile,
    probe_cpu_profile,
)

__all__ = ["CpuFeatures", "CpuProfile", "DtypePaths", "load_profile", "probe_cpu_profile"]
