"""``radixserve bench kernels``: the native kernels against their torch references and the
machine's memory bandwidth.

One attention layer of a model's shape over a KV pool whose pages are scattered at random,
as a long-running server's are (decodes, extends, and a decode group's cascade over a shared
prefix); a decode step's projections over every decoder layer's weights (so they come from
memory, as in a real step) on the engine's linear path against ``F.linear``. Calls alternate
and the medians are kept; each case's limit is the bytes it must read at a read-only probe's
bandwidth, measured beside it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from radixserve.attention import (
    ExtendRequest,
    ForwardBatch,
    NativeAttentionBackend,
    PrefixGroup,
    TorchAttentionBackend,
)
from radixserve.bench import common
from radixserve.bench.common import BandwidthProbe, Step
from radixserve.cpu import probe_cpu_profile
from radixserve.cpu.linear import cpu_linear, pack
from radixserve.cpu.native import load_native
from radixserve.memory.kv_pool import KVPool
from radixserve.model.presets import preset_hf_config
from radixserve.tables import Column, TableSpec, finish, num, plot, times


@dataclass(frozen=True)
class KernelBenchConfig:
    model: str = "bench-135m"  # a preset: its shapes, random weights
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    batches: tuple[int, ...] = (1, 8, 32)
    contexts: tuple[int, ...] = (512, 2048, 8192)
    extends: tuple[tuple[int, int, int], ...] = ((1, 0, 512), (4, 1024, 128), (8, 2048, 32))
    cascade: tuple[int, int, int] = (32, 2048, 64)  # requests, shared prefix, own suffix
    linear_rows: tuple[int, ...] = (1, 8, 16, 32, 64)
    linear_layers: int | None = None  # decoder layers' weights to run over (None: the model's)
    page_size: int = 16
    reps: int = 5
    seed: int = 0


def run_kernel_bench(cfg: KernelBenchConfig, step: Step) -> dict:
    hf = preset_hf_config(cfg.model)
    heads, kv_heads = hf.num_attention_heads, hf.num_key_value_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    probe = BandwidthProbe()
    rows, linear = [], []
    for name in cfg.dtypes:
        dtype = getattr(torch, name)
        shape = _Shape(heads, kv_heads, head_dim, dtype, cfg.page_size, probe, cfg)
        for batch in cfg.batches:
            for context in cfg.contexts:
                rows.append(shape.decode(batch, context))
                step(f"decode {name} {batch}x{context}")
        for batch, prefix, new in cfg.extends:
            rows.append(shape.extend(batch, prefix, new))
            step(f"extend {name} {batch}x({prefix}+{new})")
        rows.append(shape.cascade(*cfg.cascade))
        for n in cfg.linear_rows:
            linear.append(linear_row(hf, dtype, n, probe, cfg))
            step(f"linear {name} {n} rows")
    read_gb_s = float(np.median([r["read_gb_s"] for r in rows]))
    return {"read_gb_s": read_gb_s, "rows": rows, "linear": linear}


@dataclass(frozen=True)
class _Shape:
    heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    page: int
    probe: BandwidthProbe
    cfg: KernelBenchConfig

    def pool(self, slots: int) -> tuple[KVPool, np.ndarray]:
        """A pool of random K/V and its pages in random order (slot runs of one page)."""
        pages = -(-slots // self.page) + 1
        pool = KVPool(1, pages * self.page, self.page, self.kv_heads, self.head_dim, self.dtype)
        pool.k[0].normal_()
        pool.v[0].normal_()
        order = np.random.default_rng(self.cfg.seed).permutation(pages)
        return pool, (order[:, None] * self.page + np.arange(self.page)).reshape(-1)

    def decode(self, batch: int, context: int) -> dict:
        return self.extend(batch, context - 1, 1, "decode", f"{batch} x {context}")

    def extend(self, batch: int, prefix: int, new: int, kernel="extend", case=None) -> dict:
        seq = prefix + new
        pool, slots = self.pool(batch * seq)
        reqs = [ExtendRequest([0] * new, slots[b * seq : (b + 1) * seq]) for b in range(batch)]
        args = (pool, self.heads, self.kv_heads, self.head_dim, self.head_dim**-0.5)
        calls = {
            "torch": self._forward(TorchAttentionBackend(*args), reqs),
            "native": self._forward(NativeAttentionBackend(*args, probe_cpu_profile()), reqs),
        }
        case = case or f"{batch} x ({prefix} cached + {new} new)"
        return self._row(kernel, case, calls, batch * seq)

    def cascade(self, batch: int, prefix: int, suffix: int) -> dict:
        """Decode for requests sharing a prefix: the native kernel plain (each request reads
        the prefix) against the same kernel given the group (the prefix read once)."""
        pool, slots = self.pool(prefix + batch * suffix)
        own = [slots[prefix + i * suffix : prefix + (i + 1) * suffix] for i in range(batch)]
        reqs = [ExtendRequest([0], np.concatenate([slots[:prefix], s])) for s in own]
        args = (pool, self.heads, self.kv_heads, self.head_dim, self.head_dim**-0.5)
        native = NativeAttentionBackend(*args, probe_cpu_profile())
        group = [PrefixGroup(prefix, tuple(range(batch)))]
        calls = {"plain": self._forward(native, reqs), "native": self._forward(native, reqs, group)}
        case = f"{batch} x ({prefix} shared + {suffix})"
        return self._row("cascade", case, calls, prefix + batch * suffix)

    def _forward(self, backend, reqs: list[ExtendRequest], groups=()) -> Callable[[], object]:
        batch = ForwardBatch.create(reqs, self.page, prefix_groups=groups)
        n = sum(len(r.new_ids) for r in reqs)
        q = torch.randn(n, self.heads, self.head_dim).to(self.dtype)
        kv = torch.randn(n, self.kv_heads, self.head_dim).to(self.dtype)
        backend.prepare(batch)  # once: every layer of a forward reuses the plan
        return lambda: backend.forward(0, q, kv, kv, batch)

    def _row(self, kernel: str, case: str, calls: dict, tokens: int) -> dict:
        nbytes = 2 * tokens * self.kv_heads * self.head_dim * self.dtype.itemsize
        row = _against_read(calls, nbytes, self.dtype, case, self.probe, self.cfg.reps)
        return {"kernel": kernel} | row


def linear_row(hf, dtype: torch.dtype, n: int, probe: BandwidthProbe, cfg) -> dict:
    """A decode step's projections at ``n`` rows (each layer's q/k/v and gate/up as one
    product, as the engine runs them): the engine's path (``cpu_linear``: the native
    kernels or oneDNN where they pay) against ``F.linear``."""
    h, inter = hf.hidden_size, hf.intermediate_size
    head_dim = getattr(hf, "head_dim", None) or h // hf.num_attention_heads
    q, kv = hf.num_attention_heads * head_dim, hf.num_key_value_heads * head_dim
    shapes = [(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter)]
    layers = cfg.linear_layers or hf.num_hidden_layers
    g = torch.Generator().manual_seed(cfg.seed)
    weights = [torch.randn(o, i, generator=g).to(dtype) for _ in range(layers) for o, i in shapes]
    profile = probe_cpu_profile()
    packed = [pack(w, profile) for w in weights]
    x = {i: torch.randn(n, i, generator=g).to(dtype) for i in {h, q, inter}}
    pairs = list(zip(weights, packed, strict=True))
    calls = {
        "torch": lambda: [F.linear(x[w.shape[1]], w) for w in weights],
        "native": lambda: [cpu_linear(x[w.shape[1]], w, None, profile, p) for w, p in pairs],
    }
    nbytes = sum(w.numel() for w in weights) * dtype.itemsize
    row = _against_read(calls, nbytes, dtype, f"{n} rows x {layers} layers", probe, cfg.reps)
    return row | {"weight_mb": nbytes / 1e6}


def _against_read(calls: dict, nbytes: int, dtype, case: str, probe: BandwidthProbe, reps) -> dict:
    """The median times of ``calls`` (``native`` against ``torch`` or ``plain``), the probe
    read beside them: the native time against the time to read ``nbytes`` at its bandwidth."""
    t = common.time_alternating({**calls, "read": probe.read}, reps)
    read, base = probe.bandwidth(t["read"]), "torch" if "torch" in t else "plain"
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "case": case,
        f"{base}_ms": t[base] * 1e3,
        "speedup": t[base] / t["native"],
        "native_ms": t["native"] * 1e3,
        "read_limit_ms": nbytes / read * 1e3,
        "of_read_limit": t["native"] / (nbytes / read),
        "read_gb_s": read / 1e9,
    }


TABLES = (
    TableSpec(
        "rows",
        "attention, one layer (ms, medians)",
        (
            Column("kernel", "kernel"),
            Column("dtype", "dtype"),
            Column("case", "batch x context"),
            Column("torch_ms", "torch ms", num(2)),
            Column("plain_ms", "plain native ms", num(2), wide=True),
            Column("native_ms", "native ms", num(2)),
            Column("speedup", "speedup", times),
            Column("read_limit_ms", "read limit", num(2), wide=True),
            Column("of_read_limit", "x read limit", num(2)),
        ),
    ),
    TableSpec(
        "linear",
        "a decode step's projections over every layer (ms, medians)",
        (
            Column("dtype", "dtype"),
            Column("case", "case"),
            Column("weight_mb", "weights MB", num(0), wide=True),
            Column("torch_ms", "F.linear ms", num(1)),
            Column("native_ms", "engine ms", num(1)),
            Column("speedup", "speedup", times),
            Column("read_limit_ms", "read limit ms", num(1), wide=True),
            Column("of_read_limit", "x read limit", num(2)),
        ),
    ),
)
QUICK = {
    "batches": (1, 4),
    "contexts": (64, 600),
    "extends": ((2, 40, 24),),
    "cascade": (4, 300, 8),
    "linear_rows": (1, 5),
    "linear_layers": 2,
    "reps": 1,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_options(p, KernelBenchConfig, "dtypes reps", plot=True, reps="calls per case")


def run(args: argparse.Namespace) -> int:
    if load_native() is None:
        print("the native kernels could not be built (see the log above)")
        return 1
    cfg = common.configure(KernelBenchConfig, args, QUICK)
    cells = len(cfg.batches) * len(cfg.contexts) + len(cfg.extends) + len(cfg.linear_rows)
    total = cells * len(cfg.dtypes)
    out = common.with_progress("bench kernels", total, lambda step: run_kernel_bench(cfg, step))
    print(f"memory read bandwidth {out['read_gb_s']:.1f} GB/s (median)")
    decode = []
    for r in out["rows"]:
        if r["kernel"] == "decode":
            batch, context = r["case"].split(" x ")
            decode.append(r | {"context": int(context), "line": f"{r['dtype']}, batch {batch}"})

    def chart(path: str) -> None:
        ys = ["native_ms", "torch_ms"]
        plot(path, decode, "context", ys, "line", logx=True, logy=True)

    return finish(args, cfg, out, TABLES, chart)
