"""``radixserve bench kernels``: the native kernels against their torch references and the
machine's memory bandwidth.

One attention layer of a model's shape over a KV pool whose pages are scattered at random,
as a long-running server's are (decodes, extends, a decode group's cascade, and a prefix
group's prompts over their shared path: torch's flash kernel against the native block
kernel); the few-row linear kernel over a decode step's projections
of every decoder layer (so the weights come from memory, as in a real step); the tree's
walk with and without the native scan. Calls alternate and the medians are kept; each
case's limit is the bytes it must read at a read-only probe's bandwidth, measured beside it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch

from radixserve.attention import (
    ExtendRequest,
    ForwardBatch,
    NativeAttentionBackend,
    PrefixGroup,
    TorchAttentionBackend,
)
from radixserve.attention.dense_blocks import SharedBlock, run_shared_flash, run_shared_native
from radixserve.bench import plots
from radixserve.bench.linear_bench import LINEAR_TABLE, linear_rows_bench
from radixserve.bench.rates import BandwidthProbe
from radixserve.bench.report import (
    Column,
    TableSpec,
    finish,
    num,
    times,
    with_progress,
)
from radixserve.bench.timing import medians, time_alternating
from radixserve.bench.walk_bench import matcher_rows
from radixserve.csrc import load_native
from radixserve.memory.kv_pool import KVPool
from radixserve.model.presets import preset_hf_config

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class KernelBenchConfig:
    preset: str = "bench-135m"
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    batches: tuple[int, ...] = (1, 8, 32)
    contexts: tuple[int, ...] = (512, 2048, 8192)
    extends: tuple[tuple[int, int, int], ...] = ((1, 0, 512), (4, 1024, 128), (8, 2048, 32))
    cascade_batch: int = 32
    cascade_prefix: int = 2048
    cascade_suffix: int = 64
    # a shared block: 31 prompts of 64 tokens over a 1,024-token prefix (issue 20's extend)
    block_queries: int = 31 * 64
    block_keys: int = 1024
    linear_rows: tuple[int, ...] = (1, 8, 16, 24, 32, 48, 64)
    linear_layers: int | None = None  # decoder layers' weights to run over (None: the model's)
    matcher_tree_tokens: int = 1_000_000
    matcher_hit: int = 4096
    page_size: int = 16
    reps: int = 5
    seed: int = 0


def num_steps(cfg: KernelBenchConfig) -> int:
    attention = len(cfg.batches) * len(cfg.contexts) + len(cfg.extends) + 2
    return (attention + len(cfg.linear_rows)) * len(cfg.dtypes) + 1


def run_kernel_bench(cfg: KernelBenchConfig, step: Callable[[str], None]) -> dict:
    hf = preset_hf_config(cfg.preset)
    heads, kv_heads = hf.num_attention_heads, hf.num_key_value_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    probe = BandwidthProbe()
    rows = []
    for dtype in cfg.dtypes:
        shape = _Shape(heads, kv_heads, head_dim, _DTYPES[dtype], cfg.page_size)
        for batch in cfg.batches:
            for context in cfg.contexts:
                rows.append(shape.decode(batch, context, probe, cfg))
                step(f"decode {dtype} {batch}x{context}")
        for batch, prefix, new in cfg.extends:
            rows.append(shape.extend(batch, prefix, new, probe, cfg))
            step(f"extend {dtype} {batch}x({prefix}+{new})")
        rows.append(shape.cascade(probe, cfg))
        step(f"cascade {dtype}")
        rows.append(shape.shared_block(probe, cfg))
        step(f"shared block {dtype}")
    linear = []
    for dtype in cfg.dtypes:
        linear += linear_rows_bench(
            hf, _DTYPES[dtype], probe, cfg.linear_rows, cfg.linear_layers, cfg.reps, cfg.seed, step
        )
    matcher = matcher_rows(cfg.matcher_tree_tokens, cfg.matcher_hit, cfg.page_size, cfg.seed)
    step("matcher")
    return {
        "read_gb_s": float(np.median([r["read_gb_s"] for r in rows])),
        "rows": rows,
        "linear": linear,
        "matcher": matcher,
    }


@dataclass(frozen=True)
class _Shape:
    heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    page: int

    def pool(self, slots: int, rng: np.random.Generator) -> tuple[KVPool, np.ndarray]:
        """A pool of random K/V and its pages in random order (slot runs of one page)."""
        pages = -(-slots // self.page) + 1
        pool = KVPool(1, pages * self.page, self.page, self.kv_heads, self.head_dim, self.dtype)
        pool.k[0].normal_()
        pool.v[0].normal_()
        order = rng.permutation(pages)
        return pool, (order[:, None] * self.page + np.arange(self.page)).reshape(-1)

    def backends(self, pool: KVPool):
        args = (pool, self.heads, self.kv_heads, self.head_dim, self.head_dim**-0.5)
        return TorchAttentionBackend(*args), NativeAttentionBackend(*args)

    def kv_bytes(self, tokens: int) -> int:
        return 2 * tokens * self.kv_heads * self.head_dim * self.dtype.itemsize

    def decode(self, batch: int, context: int, probe: BandwidthProbe, cfg) -> dict:
        rng = np.random.default_rng(cfg.seed)
        pool, slots = self.pool(batch * context, rng)
        reqs = [ExtendRequest([0], slots[b * context : (b + 1) * context]) for b in range(batch)]
        times = self._compare(pool, reqs, probe, cfg.reps)
        return self._row("decode", f"{batch} x {context}", times, probe, batch * context)

    def extend(self, batch: int, prefix: int, new: int, probe: BandwidthProbe, cfg) -> dict:
        rng = np.random.default_rng(cfg.seed)
        seq = prefix + new
        pool, slots = self.pool(batch * seq, rng)
        reqs = [ExtendRequest([0] * new, slots[b * seq : (b + 1) * seq]) for b in range(batch)]
        times = self._compare(pool, reqs, probe, cfg.reps)
        case = f"{batch} x ({prefix} cached + {new} new)"
        return self._row("extend", case, times, probe, batch * seq)

    def cascade(self, probe: BandwidthProbe, cfg) -> dict:
        """Decode for requests sharing a prefix: the native kernel plain (each request reads
        the prefix) against the same kernel given the group (the prefix read once)."""
        rng = np.random.default_rng(cfg.seed)
        b, n, s = cfg.cascade_batch, cfg.cascade_prefix, cfg.cascade_suffix
        pool, slots = self.pool(n + b * s, rng)
        shared = slots[:n]
        reqs = [
            ExtendRequest([0], np.concatenate([shared, slots[n + i * s : n + (i + 1) * s]]))
            for i in range(b)
        ]
        plain = ForwardBatch.create(reqs, self.page)
        grouped = ForwardBatch.create(
            reqs, self.page, prefix_groups=[PrefixGroup(n, tuple(range(b)))]
        )
        native = self.backends(pool)[1]
        q = torch.randn(b, self.heads, self.head_dim).to(self.dtype)
        kv = torch.randn(b, self.kv_heads, self.head_dim).to(self.dtype)
        calls = {
            "plain": _forward(native, plain, q, kv),
            "native": _forward(native, grouped, q, kv),
            "read": probe.read,
        }
        times = _alternate(calls, cfg.reps)
        row = self._row("cascade", f"{b} x ({n} shared + {s})", times, probe, n + b * s)
        return {
            **row,
            "plain_ms": times["plain"] * 1e3,
            "speedup": times["plain"] / times["native"],
        }

    def shared_block(self, probe: BandwidthProbe, cfg) -> dict:
        """Many queries over one path of the pool, every key visible to every query."""
        n, keys = cfg.block_queries, cfg.block_keys
        pool, slots = self.pool(keys, np.random.default_rng(cfg.seed))
        block = SharedBlock(torch.arange(n), torch.from_numpy(slots[:keys]))
        q = torch.randn(n, self.heads, self.head_dim).to(self.dtype)
        args = (block, q, pool.k[0], pool.v[0], self.head_dim**-0.5)
        calls = {
            "torch": partial(run_shared_flash, *args),
            "native": partial(run_shared_native, *args),
            "read": probe.read,
        }
        times = _alternate(calls, cfg.reps)
        return self._row("block", f"{n} x {keys} shared", times, probe, keys)

    def _compare(
        self, pool: KVPool, reqs: list[ExtendRequest], probe: BandwidthProbe, reps: int
    ) -> dict[str, float]:
        n = sum(len(r.new_ids) for r in reqs)
        q = torch.randn(n, self.heads, self.head_dim).to(self.dtype)
        kv = torch.randn(n, self.kv_heads, self.head_dim).to(self.dtype)
        calls = {
            name: _forward(backend, ForwardBatch.create(reqs, self.page), q, kv)
            for name, backend in zip(("torch", "native"), self.backends(pool), strict=True)
        }
        return _alternate({**calls, "read": probe.read}, reps)

    def _row(
        self, kernel: str, case: str, times: dict[str, float], probe: BandwidthProbe, tokens: int
    ) -> dict:
        read = probe.bandwidth(times["read"])
        read_limit = self.kv_bytes(tokens) / read
        row = {
            "kernel": kernel,
            "dtype": str(self.dtype).removeprefix("torch."),
            "case": case,
            "native_ms": times["native"] * 1e3,
            "read_limit_ms": read_limit * 1e3,
            "of_read_limit": times["native"] / read_limit,
            "read_gb_s": read / 1e9,
        }
        if "torch" in times:
            row |= {"torch_ms": times["torch"] * 1e3, "speedup": times["torch"] / times["native"]}
        return row


def _forward(backend, batch: ForwardBatch, q, kv) -> Callable[[], object]:
    backend.prepare(batch)  # once: every layer of a forward reuses the plan
    return lambda: backend.forward(0, q, kv, kv, batch)


def _alternate(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    return medians(time_alternating(calls, reps))


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
            Column("read_gb_s", "read GB/s", num(1), wide=True),
        ),
    ),
    LINEAR_TABLE,
    TableSpec(
        "matcher",
        "the radix tree's walk, p50 µs",
        (
            Column("case", "case"),
            Column("python_walk_us", "Python walk", num(1)),
            Column("native_walk_us", "native scan", num(1)),
            Column("match_prefix_us", "match_prefix", num(1)),
        ),
    ),
)

QUICK = {
    "batches": (1, 4),
    "contexts": (64, 600),
    "extends": ((2, 40, 24),),
    "cascade_batch": 4,
    "cascade_prefix": 300,
    "cascade_suffix": 8,
    "block_queries": 40,
    "block_keys": 100,
    "linear_rows": (1, 5),
    "linear_layers": 2,
    "matcher_tree_tokens": 20_000,
    "matcher_hit": 1024,
    "reps": 1,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bench-135m", help="a preset whose shape to use")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--reps", type=int, default=5, help="alternating calls per case")
    p.add_argument("--quick", action="store_true", help="small shapes, for smoke tests")
    p.add_argument("--plot", help="write a PNG chart to this file")


def run(args: argparse.Namespace) -> int:
    if load_native() is None:
        print("the native kernels could not be built (see the log above)")
        return 1
    cfg = KernelBenchConfig(preset=args.model, dtypes=tuple(args.dtypes), reps=args.reps)
    if args.quick:
        cfg = replace(cfg, **QUICK)
    out = with_progress("bench kernels", num_steps(cfg), lambda s: run_kernel_bench(cfg, s))
    print(f"memory read bandwidth {out['read_gb_s']:.1f} GB/s (median)")
    return finish(args, cfg, out, TABLES, lambda path: plots.plot_kernel_bench(out["rows"], path))
