"""What this machine can do at best, measured beside the benchmarks that compare against it:
torch's GEMM rate on a prefill-sized product, and the rate a read-only pass streams memory."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from radixserve.bench.timing import medians, time_alternating
from radixserve.csrc import onednn
from radixserve.model.linear import can_pack


def gemm_rate(dtype: torch.dtype, reps: int = 5) -> float:
    """FLOP/s of torch's faster GEMM here on a prefill-sized product (2,048 x 576 by 576 x
    1,536, bench-135m's MLP): its BLAS, or oneDNN on packed weights where the engine packs
    them (on an AMD EPYC oneDNN ran float32 ~2.5x faster). The rate a forward's
    multiply-adds could run at, at best."""
    x, w = torch.randn(2048, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype)
    calls = {"blas": partial(torch.nn.functional.linear, x, w)}
    if can_pack(dtype):
        calls["onednn"] = partial(onednn.linear, x, onednn.pack(w))
    seconds = min(medians(time_alternating(calls, reps)).values())
    return 2 * x.shape[0] * w.shape[0] * w.shape[1] / seconds


class BandwidthProbe:
    """A torch sum (all threads) over a tensor larger than the caches: it only reads, as a
    kernel streaming weights or K/V does, so the bytes a case must read over this bandwidth
    are that case's limit (timed beside the case, so a slow spell slows the limit too)."""

    def __init__(self) -> None:
        self.src = torch.ones(probe_bytes() // 4)

    def read(self) -> None:
        self.src.sum()

    def bandwidth(self, seconds: float) -> float:
        return self.src.numel() * 4 / seconds

    def measure(self, reps: int = 5) -> float:
        """Bytes/s, the median of ``reps`` reads."""
        return self.bandwidth(medians(time_alternating({"read": self.read}, reps))["read"])


def probe_bytes() -> int:
    """Twice the last-level cache, and at least 256 MiB: a VM of this project's kind reports a
    480 MiB L3, which held a 64 MiB probe and read it at 53 GB/s against ~24 from memory."""
    sizes = [256 << 20]
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(2 * int(text.rstrip("KMG")) * unit)
    return max(sizes)
