"""The native builds a kernel test runs against: this CPU's own and, on a CPU with AVX-512,
the x86-64-v3 (AVX2) one too, whose vector paths (8-float vectors, 16 registers) differ."""

import pytest


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()


TARGETS = [
    "native",
    pytest.param(
        "x86-64-v3",
        marks=pytest.mark.skipif(
            "avx512f" not in _cpu_flags() or "avx2" not in _cpu_flags(),
            reason="this CPU's own build is the AVX2 one (or it cannot run one)",
        ),
    ),
]
