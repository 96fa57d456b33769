"""torch's oneDNN GEMM, called directly: on some CPUs it multiplies far faster than torch's
default BLAS (on an AMD EPYC, MKL ran bench-135m's float32 projections at 155-180 GFLOP/s
and oneDNN at ~410), and it takes weights laid out ahead of time for its kernels."""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

# The batch size oneDNN is told to expect when it lays weights out: a decode step's.
PACK_BATCH_HINT = 32
# How much faster than torch's own float32 GEMM oneDNN's must run here for the engine to
# use it (weights packed a second time): 2.3-2.6x on a Zen 5 AMD EPYC; on a Zen 4 one the
# probe read 1.11-1.61x where oneDNN ran the prefill sizes 1.15-1.25x faster (a cold
# long-prefix pass ~9% faster), so the bar sits just above a tie: below it the second copy
# of the weights buys nothing. On an Intel Xeon oneDNN's packed float32 measured alike at
# decode sizes (its prefill sizes unmeasured there: the probe decides).
FLOAT32_MIN_GAIN = 1.05


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``x @ weight.T (+ bias)`` in oneDNN, ``weight`` plain or laid out by ``pack``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` laid out for oneDNN's kernels (a copy)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)


def float32_faster() -> bool:
    """Whether oneDNN multiplies float32 clearly faster than torch's BLAS here."""
    return float32_gain() >= FLOAT32_MIN_GAIN


@functools.cache
def float32_gain() -> float:
    """torch's float32 GEMM time over oneDNN's on packed weights, for a prefill-sized product
    (the best of six alternated runs each, once per process); 0 without oneDNN."""
    if not available():
        return 0.0
    x, w = torch.randn(512, 576), torch.randn(1536, 576)
    packed = pack(w)
    calls = (lambda: F.linear(x, w), lambda: linear(x, packed))
    best = [float("inf"), float("inf")]
    with torch.inference_mode():
        for _ in range(7):  # the first round warms both up
            for i, call in enumerate(calls):
                start = time.perf_counter()
                call()
                best[i] = min(best[i], time.perf_counter() - start)
    return best[0] / best[1]
