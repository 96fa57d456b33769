"""``radixserve bench model``: our forward over the paged pool against transformers' forward.

Both run the same weights in the same process (quantized ones, ``--quantize``, against
transformers on their dequantized values), alternating call by call so machine drift
hits both alike. Prefill is one prompt from scratch (transformers computes only the last
token's logits too); decode is one new token for each of ``batch`` requests with
``context`` tokens already cached (transformers with its ``DynamicCache``, which has no
paged batching). The cached K/V are random on both sides: computing them would cost
minutes and does not change the work of a decode step. ``read ms`` is what the step must
read (the weights once, the cached K/V) at a read-only probe's bandwidth.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from radixserve.attention import ExtendRequest, ForwardBatch, create_attention_backend
from radixserve.bench import common
from radixserve.bench.common import BandwidthProbe, Step
from radixserve.bench.transformers_peer import decoder, prefill, transformers_twin
from radixserve.cpu import probe_cpu_profile
from radixserve.memory import KVSlotAllocator
from radixserve.memory.host_malloc import keep_freed_memory
from radixserve.memory.kv_pool import KVPool
from radixserve.model.build import LoadedModel
from radixserve.model.loader import load_model
from radixserve.model.quantized_model import quantized_modules
from radixserve.tables import Column, TableSpec, finish, num


@dataclass(frozen=True)
class ModelBenchConfig:
    model: str = "bench-135m"  # a preset (random weights), a named model or a GGUF file
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    quantize: tuple[str, ...] = ("none",)  # each of: none, auto (a GGUF's own), int8, int4
    prefill_lens: tuple[int, ...] = (512, 2048)
    decode_batches: tuple[int, ...] = (1, 8, 32)
    context: int = 1024
    decode_steps: int = 8
    reps: int = 3
    page_size: int = 16
    attention_backend: str = "auto"  # native on CPU when it builds
    seed: int = 0


class _Ours:
    """Our decoder with a KV pool big enough for one case at a time."""

    def __init__(self, loaded: LoadedModel, cfg: ModelBenchConfig) -> None:
        c, page = loaded.config, cfg.page_size
        need = max(max(cfg.prefill_lens), max(cfg.decode_batches) * (cfg.context + 64 + page))
        slots = -(-need // page) * page
        profile = probe_cpu_profile()
        loaded.model.use_cpu_profile(profile)  # as the engine does
        self.model, self.page_size = loaded.model, page
        self.allocator = KVSlotAllocator(slots, page)
        dtype = next(loaded.model.parameters()).dtype
        pool = KVPool(c.num_layers, slots, page, c.num_kv_heads, c.head_dim, dtype)
        heads = (c.num_heads, c.num_kv_heads, c.head_dim, c.head_dim**-0.5)
        self.backend = create_attention_backend(cfg.attention_backend, pool, *heads, profile)

    def forward(self, requests: list[ExtendRequest]) -> torch.Tensor:
        return self.model(ForwardBatch.create(requests, self.page_size), self.backend).last

    def prefill(self, ids: np.ndarray) -> torch.Tensor:
        slots = self.allocator.alloc(len(ids))
        out = self.forward([ExtendRequest(ids, slots[: len(ids)])])[0]
        self.allocator.free(slots)
        return out

    def decoder(self, batch: int, context: int) -> Callable[[], None]:
        """One decode step for ``batch`` requests whose ``context`` tokens are cached (their
        K/V values are whatever the pool holds: the work does not depend on them)."""
        self.allocator.reset()
        slots = [self.allocator.alloc(context + 64) for _ in range(batch)]
        length = [context]

        def step() -> None:
            self.forward([ExtendRequest([1], s[: length[0] + 1]) for s in slots])
            length[0] += 1

        return step


def read_bytes(loaded: LoadedModel, cached_tokens: int, logit_rows: int) -> int:
    """Bytes a forward must read at least: every decoder layer's projection weights once,
    the output weight when it computes logits, ``cached_tokens`` tokens' K/V in every layer."""
    cfg, model = loaded.config, loaded.model
    size = next(model.parameters()).element_size()
    quantized = quantized_modules(model)

    def nbytes(name: str, module: torch.nn.Module) -> int:
        if name in quantized:
            return module.quant.nbytes
        return module.weight.numel() * size if isinstance(module, torch.nn.Linear) else 0

    weights = sum(nbytes(n, m) for n, m in model.named_modules() if n.startswith("model.layers."))
    if logit_rows:
        head = "model.embed_tokens" if cfg.tie_word_embeddings else "lm_head"
        weights += nbytes(head, model.get_submodule(head)) or model.output_weight.numel() * size
    kv = cached_tokens * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim
    return weights + kv * size


def run_model_bench(cfg: ModelBenchConfig, step: Step = lambda label: None) -> list[dict]:
    rng = np.random.default_rng(cfg.seed)
    keep_freed_memory()  # as the engine does (process-wide, so transformers' side gains too)
    read_rate = BandwidthProbe().measure()
    rows = []
    for dtype, quantize in itertools.product(cfg.dtypes, cfg.quantize):
        loaded = load_model(cfg.model, getattr(torch, dtype), quantize=quantize)
        ours, theirs = _Ours(loaded, cfg), transformers_twin(loaded)
        weights = _weights_label(loaded, dtype)
        # refuse to time two models that do not compute the same thing
        ids = rng.integers(0, loaded.config.vocab_size, 24).astype(np.int64)
        mine, ref = ours.prefill(ids), prefill(theirs, ids).float()
        if not torch.allclose(mine, ref, atol=0.05 * float(ref.abs().max()) + 1e-4):
            raise RuntimeError(
                f"our logits differ from transformers' by {(mine - ref).abs().max()}"
            )
        for n in cfg.prefill_lens:
            step(f"{weights} prefill {n}")
            ids = rng.integers(0, loaded.config.vocab_size, n).astype(np.int64)
            calls = {"ours": partial(ours.prefill, ids), "theirs": partial(prefill, theirs, ids)}
            read = read_bytes(loaded, 0, 1) / read_rate
            rows.append(
                _row(weights, f"prefill {n}", n, common.time_alternating(calls, cfg.reps), read)
            )
        for b in cfg.decode_batches:
            step(f"{weights} decode batch {b}")
            calls = {
                "ours": ours.decoder(b, cfg.context),
                "theirs": decoder(theirs, b, cfg.context),
            }
            read = read_bytes(loaded, b * cfg.context, b) / read_rate
            t = common.time_alternating(calls, cfg.decode_steps)
            rows.append(_row(weights, f"decode {b} x {cfg.context}", b, t, read))
        for row in rows:
            row.setdefault("attention", ours.backend.name)
    return rows


def _weights_label(loaded: LoadedModel, dtype: str) -> str:
    """The weights' formats as served: the dtype, or the quantized formats beside it."""
    formats = loaded.weights()["quantized"]
    return "+".join(sorted(formats)) if formats else dtype


def _row(weights: str, case: str, tokens: int, t: dict[str, float], read: float) -> dict:
    """``t``: median seconds of ours and theirs; ``read``: seconds to read what it must."""
    return {
        "weights": weights,
        "case": case,
        "ours_tok_s": tokens / t["ours"],
        "transformers_tok_s": tokens / t["theirs"],
        "ratio": t["theirs"] / t["ours"],
        "ours_ms": 1000 * t["ours"],
        "read_ms": 1000 * read,
        "x_read": t["ours"] / read,
    }


TABLES = (
    TableSpec(
        "rows",
        "forward throughput (tokens/s, medians of alternating calls)",
        (
            Column("weights", "weights"),
            Column("case", "case"),
            Column("attention", "attention", wide=True),
            Column("ours_tok_s", "ours", num(0)),
            Column("transformers_tok_s", "transformers", num(0)),
            Column("ratio", "ratio", num(2)),
            Column("ours_ms", "ms", num(1), wide=True),
            Column("read_ms", "read ms", num(1), wide=True),
            Column("x_read", "x read", num(2)),
        ),
    ),
)
QUICK = {
    "prefill_lens": (64,),
    "decode_batches": (1, 4),
    "context": 64,
    "decode_steps": 2,
    "reps": 1,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    helps = {"attention_backend": "auto, torch or native"}
    helps["quantize"] = "none, auto (a GGUF file's own formats), int8, int4"
    common.add_options(p, ModelBenchConfig, "dtypes quantize attention_backend", **helps)


def run(args: argparse.Namespace) -> int:
    cfg = common.configure(ModelBenchConfig, args, QUICK)
    cases = len(cfg.dtypes) * len(cfg.quantize)
    total = cases * (len(cfg.prefill_lens) + len(cfg.decode_batches))
    rows = common.with_progress("bench model", total, lambda step: run_model_bench(cfg, step))
    print(f"{cfg.model}, {torch.get_num_threads()} threads")
    return finish(args, cfg, {"rows": rows}, TABLES)
