"""``bench kernels``' linear rows: a decode step's projections over every decoder layer's
weights (so they come from memory, as in a real step) at a few rows, each path beside the
others: torch's ``F.linear``, the native kernel on the plain weights, on column panels (each
projection alone, or q/k/v and gate/up fused as the engine runs them), and oneDNN on its
packed ones."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from radixserve.bench.rates import BandwidthProbe
from radixserve.bench.report import Column, TableSpec, num, times
from radixserve.bench.timing import medians, time_alternating
from radixserve.csrc import load_native, onednn
from radixserve.model.linear import can_pack


def linear_rows_bench(
    hf,
    dtype: torch.dtype,
    probe: BandwidthProbe,
    row_counts: Sequence[int],
    layers: int | None,
    reps: int,
    seed: int,
    step: Callable[[str], None],
) -> list[dict]:
    """A decode step's projections (q, k, v, o, gate, up, down of every decoder layer) at
    each of ``row_counts`` rows, the paths alternately: the fastest of the non-torch ones
    against torch and against the time to read the weights once at the probe's
    bandwidth."""
    h, inter = hf.hidden_size, hf.intermediate_size
    head_dim = getattr(hf, "head_dim", None) or h // hf.num_attention_heads
    q, kv = hf.num_attention_heads * head_dim, hf.num_key_value_heads * head_dim
    shapes = [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]
    layers = layers or hf.num_hidden_layers  # None: the model's
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o, i, generator=g).to(dtype) for _ in range(layers) for o, i in shapes]
    nbytes = sum(w.numel() for w in weights) * dtype.itemsize
    kernels = load_native()
    packed = [onednn.pack(w) for w in weights] if can_pack(dtype) else None
    has_panels = dtype == torch.float32 or (dtype == torch.bfloat16 and kernels.bf16_dot())
    panels = [kernels.pack_panels(w) for w in weights] if has_panels else None
    # the engine's few-row path: each layer's q/k/v and gate/up as one product (FusedLinear)
    fused = None
    if has_panels:
        fused = []
        for i in range(0, len(weights), len(shapes)):
            q_, k_, v_, o_, gate, up, down = weights[i : i + len(shapes)]
            for w in (torch.cat([q_, k_, v_]), o_, torch.cat([gate, up]), down):
                fused.append((w, kernels.pack_panels(w)))
    rows = []
    for n in row_counts:
        inputs = {i: torch.randn(n, i, generator=g).to(dtype) for i in {h, q, inter}}

        def over_layers(fn, inputs=inputs):
            return lambda: [fn(inputs[w.shape[1]], w) for w in weights]

        calls = {
            "torch": over_layers(F.linear),
            "native": over_layers(kernels.linear_rows),
            "read": probe.read,
        }
        if packed is not None:
            calls["onednn"] = lambda inputs=inputs: [
                onednn.linear(inputs[w.shape[1]], p) for w, p in zip(weights, packed, strict=True)
            ]
        if panels is not None:
            calls["panels"] = lambda inputs=inputs: [
                kernels.panel_linear(inputs[w.shape[1]], p, w.shape[0])
                for w, p in zip(weights, panels, strict=True)
            ]
        if fused is not None:
            calls["fused"] = lambda inputs=inputs: [
                kernels.panel_linear(inputs[w.shape[1]], p, w.shape[0]) for w, p in fused
            ]
        times = medians(time_alternating(calls, reps))
        read_limit = nbytes / probe.bandwidth(times["read"])
        flops = 2 * n * nbytes / dtype.itemsize
        best = min(t for name, t in times.items() if name not in ("torch", "read"))
        row = {
            "kernel": "linear",
            "dtype": str(dtype).removeprefix("torch."),
            "case": f"{n} rows x {layers} layers",
            "weight_mb": nbytes / 1e6,
            "torch_ms": times["torch"] * 1e3,
            "native_ms": times["native"] * 1e3,
            "onednn_ms": times["onednn"] * 1e3 if "onednn" in times else None,
            "panels_ms": times["panels"] * 1e3 if "panels" in times else None,
            "fused_ms": times["fused"] * 1e3 if "fused" in times else None,
            "speedup": times["torch"] / best,
            "gflop_s": flops / best / 1e9,
            "read_limit_ms": read_limit * 1e3,
            "of_read_limit": best / read_limit,
            "read_gb_s": probe.bandwidth(times["read"]) / 1e9,
        }
        rows.append(row)
        step(f"linear {rows[-1]['dtype']} {n} rows")
    return rows


LINEAR_TABLE = TableSpec(
    "linear",
    "linear layers at a few rows (every layer's projections)",
    (
        Column("dtype", "dtype"),
        Column("case", "case"),
        Column("weight_mb", "weights MB", num(0), wide=True),
        Column("torch_ms", "F.linear ms", num(1)),
        Column("native_ms", "native ms", num(1), wide=True),
        Column("onednn_ms", "oneDNN ms", num(1)),
        Column("panels_ms", "panels ms", num(1)),
        Column("fused_ms", "fused ms", num(1)),
        Column("speedup", "speedup", times, wide=True),
        Column("gflop_s", "GFLOP/s", num(1), wide=True),
        Column("read_limit_ms", "read limit ms", num(1), wide=True),
        Column("of_read_limit", "x read limit", num(2)),
    ),
)
