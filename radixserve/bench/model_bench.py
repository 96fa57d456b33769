"""``radixserve bench model``: our forward over the paged pool against transformers' forward.

Both run the same weights in the same process, alternating call by call so machine drift
hits both alike. Prefill is one prompt from scratch (transformers computes only the last
token's logits too, via ``logits_to_keep=1``); decode is one new token for each of ``batch``
requests with ``context`` tokens already cached (transformers with its ``DynamicCache``,
which has no paged batching). The cached K/V are random on both sides: computing them would
cost minutes and does not change the work of a decode step.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch

from radixserve.attention import ExtendRequest, ForwardBatch, create_attention_backend
from radixserve.bench.rates import BandwidthProbe, gemm_rate
from radixserve.bench.report import (
    Column,
    TableSpec,
    finish,
    num,
    with_progress,
)
from radixserve.bench.timing import medians, time_alternating
from radixserve.memory import KVSlotAllocator
from radixserve.memory.host_malloc import keep_freed_memory
from radixserve.memory.kv_pool import KVPool
from radixserve.model.loader import LoadedModel
from radixserve.model.presets import load_preset

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelBenchConfig:
    preset: str = "bench-135m"
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
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

    def __init__(
        self, loaded: LoadedModel, num_slots: int, page_size: int, attention_backend: str
    ) -> None:
        cfg = loaded.config
        dtype = next(loaded.model.parameters()).dtype
        loaded.model.pack_weights()  # as the engine does; transformers' twin copies the plain
        self.model, self.page_size = loaded.model, page_size
        self.allocator = KVSlotAllocator(num_slots, page_size)
        pool = KVPool(cfg.num_layers, num_slots, page_size, cfg.num_kv_heads, cfg.head_dim, dtype)
        self.backend = create_attention_backend(
            attention_backend,
            pool,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.head_dim**-0.5,
        )

    def forward(self, requests: list[ExtendRequest]) -> torch.Tensor:
        batch = ForwardBatch.create(requests, self.page_size)
        return self.model(batch, self.backend).last

    def prefill(self, ids: np.ndarray) -> None:
        slots = self.allocator.alloc(len(ids))
        self.forward([ExtendRequest(ids, slots[: len(ids)])])
        self.allocator.free(slots)

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


def transformers_twin(loaded: LoadedModel):
    """transformers' model for the same config, holding the same weights."""
    from transformers import AutoModelForCausalLM

    dtype = next(loaded.model.parameters()).dtype
    hf = AutoModelForCausalLM.from_config(loaded.hf_config, dtype=dtype)
    missing, unexpected = hf.load_state_dict(loaded.model.state_dict(), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"weights do not line up: {missing[:3]} {unexpected[:3]}")
    hf.tie_weights()
    return hf.eval()


class _Theirs:
    def __init__(self, loaded: LoadedModel) -> None:
        self.model = transformers_twin(loaded)

    @torch.inference_mode()
    def last_logits(self, ids: np.ndarray) -> torch.Tensor:
        return self.model(torch.from_numpy(ids)[None]).logits[0, -1].float()

    @torch.inference_mode()
    def prefill(self, ids: np.ndarray) -> None:
        self.model(torch.from_numpy(ids)[None], logits_to_keep=1, use_cache=False)

    @torch.inference_mode()
    def decoder(self, batch: int, context: int) -> Callable[[], None]:
        """The same for transformers: a ``DynamicCache`` pre-filled with random K/V."""
        from transformers import DynamicCache

        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (batch, cfg.num_key_value_heads, context, head_dim)
        dtype = self.model.dtype
        cache = DynamicCache(
            [(torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype))]
            * cfg.num_hidden_layers
        )
        # transformers 5 renamed `past_key_values` to `cache`.
        params = inspect.signature(self.model.forward).parameters
        key = "cache" if "cache" in params else "past_key_values"
        token = torch.ones(batch, 1, dtype=torch.long)

        @torch.inference_mode()
        def step() -> None:
            self.model(token, use_cache=True, logits_to_keep=1, **{key: cache})

        return step


def _alternate(ours: Callable, theirs: Callable, reps: int) -> tuple[float, float]:
    """Median seconds of each, alternating (both warmed up once)."""
    m = medians(time_alternating({"ours": ours, "theirs": theirs}, reps))
    return m["ours"], m["theirs"]


def _projection_weights(loaded: LoadedModel) -> int:
    """Elements of every decoder layer's projection weights."""
    return sum(
        m.weight.numel()
        for name, m in loaded.model.named_modules()
        if name.startswith("model.layers.") and isinstance(m, torch.nn.Linear)
    )


def forward_flops(loaded: LoadedModel, tokens: int, pairs: int, logit_rows: int) -> float:
    """Multiply-adds x 2 of a forward: every projection for ``tokens`` new tokens, ``pairs``
    (query, key) pairs of attention (scores and the weighted sum), ``logit_rows`` logits."""
    cfg = loaded.config
    per_token = _projection_weights(loaded)
    attention = pairs * cfg.num_heads * cfg.head_dim * 2 * cfg.num_layers
    return 2 * (tokens * per_token + attention + logit_rows * cfg.vocab_size * cfg.hidden_size)


def forward_bytes(loaded: LoadedModel, cached_tokens: int, logit_rows: int) -> int:
    """Bytes a forward must read at least: every projection's weights once, the output
    weight when it computes logits, and ``cached_tokens`` tokens' K/V in every layer."""
    cfg = loaded.config
    item = next(loaded.model.parameters()).element_size()
    weights = _projection_weights(loaded)
    if logit_rows:
        weights += loaded.model.output_weight.numel()
    kv = cached_tokens * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim
    return (weights + kv) * item


def run_model_bench(
    cfg: ModelBenchConfig, on_step: Callable[[str], None] | None = None
) -> list[dict]:
    rng = np.random.default_rng(cfg.seed)
    keep_freed_memory()  # as the engine does (process-wide, so transformers' side gains too)
    read_rate = BandwidthProbe().measure()
    rows = []
    for dtype_name in cfg.dtypes:
        loaded = load_preset(cfg.preset, dtype=_DTYPES[dtype_name])
        rate = gemm_rate(_DTYPES[dtype_name])
        vocab = loaded.config.vocab_size
        max_batch = max(cfg.decode_batches)
        need = max(max(cfg.prefill_lens), max_batch * (cfg.context + 64 + cfg.page_size))
        slots = -(-need // cfg.page_size) * cfg.page_size
        ours = _Ours(loaded, slots, cfg.page_size, cfg.attention_backend)
        theirs = _Theirs(loaded)
        _check_same_model(ours, theirs, vocab, rng)
        for n in cfg.prefill_lens:
            if on_step:
                on_step(f"{dtype_name} prefill {n}")
            ids = rng.integers(0, vocab, n).astype(np.int64)
            t_ours, t_theirs = _alternate(
                partial(ours.prefill, ids), partial(theirs.prefill, ids), cfg.reps
            )
            floor = forward_flops(loaded, n, n * (n + 1) // 2, 1) / rate
            read = forward_bytes(loaded, 0, 1) / read_rate
            rows.append(_row(dtype_name, f"prefill {n}", n, t_ours, t_theirs, floor, read))
        for batch in cfg.decode_batches:
            if on_step:
                on_step(f"{dtype_name} decode batch {batch}")
            step_ours = ours.decoder(batch, cfg.context)
            step_theirs = theirs.decoder(batch, cfg.context)
            t_ours, t_theirs = _alternate(step_ours, step_theirs, cfg.decode_steps)
            label = f"decode {batch} x {cfg.context}"
            floor = forward_flops(loaded, batch, batch * (cfg.context + 1), batch) / rate
            read = forward_bytes(loaded, batch * cfg.context, batch) / read_rate
            rows.append(_row(dtype_name, label, batch, t_ours, t_theirs, floor, read))
        for row in rows:
            row.setdefault("attention", ours.backend.name)
    return rows


def _check_same_model(ours: _Ours, theirs: _Theirs, vocab: int, rng) -> None:
    """Refuse to time two models that do not compute the same thing."""
    ids = rng.integers(0, vocab, 24).astype(np.int64)
    slots = ours.allocator.alloc(len(ids))
    mine = ours.forward([ExtendRequest(ids, slots[: len(ids)])])[0]
    ours.allocator.free(slots)
    ref = theirs.last_logits(ids)
    if not torch.allclose(mine, ref, atol=0.05 * float(ref.abs().max()) + 1e-4):
        raise RuntimeError(f"our logits differ from transformers' by {(mine - ref).abs().max()}")


def _row(
    dtype: str, case: str, tokens: int, t_ours: float, t_theirs: float, floor: float, read: float
) -> dict:
    """``floor``: the case's FLOPs at the GEMM rate; ``read``: its bytes at the read rate."""
    return {
        "dtype": dtype,
        "case": case,
        "ours_tok_s": tokens / t_ours,
        "transformers_tok_s": tokens / t_theirs,
        "ratio": t_theirs / t_ours,
        "ours_ms": 1000 * t_ours,
        "floor_ms": 1000 * floor,
        "x_floor": t_ours / floor,
        "read_ms": 1000 * read,
        "x_roofline": t_ours / max(floor, read),
    }


def num_steps(cfg: ModelBenchConfig) -> int:
    return len(cfg.dtypes) * (len(cfg.prefill_lens) + len(cfg.decode_batches))


TABLES = (
    TableSpec(
        "rows",
        "forward throughput (tokens/s, medians of alternating calls)",
        (
            Column("dtype", "dtype"),
            Column("case", "case"),
            Column("attention", "attention", wide=True),
            Column("ours_tok_s", "ours", num(0)),
            Column("transformers_tok_s", "transformers", num(0)),
            Column("ratio", "ratio", num(2)),
            Column("ours_ms", "ms", num(1), wide=True),
            Column("floor_ms", "floor ms", num(1), wide=True),
            Column("x_floor", "x floor", num(2)),
            Column("read_ms", "read ms", num(1), wide=True),
            Column("x_roofline", "x roof", num(2)),
        ),
    ),
)
QUICK = {"prefill_lens": (64,), "decode_batches": (1, 4), "context": 64, "decode_steps": 2}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bench-135m", help="a preset")
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--attention-backend", default="auto", help="auto, torch or native")
    p.add_argument("--quick", action="store_true", help="small shapes, for smoke tests")


def run(args: argparse.Namespace) -> int:
    cfg = ModelBenchConfig(
        preset=args.model, dtypes=tuple(args.dtypes), attention_backend=args.attention_backend
    )
    if args.quick:
        cfg = replace(cfg, reps=1, **QUICK)
    rows = with_progress("bench model", num_steps(cfg), lambda step: run_model_bench(cfg, step))
    print(f"{cfg.preset}, {torch.get_num_threads()} threads")
    return finish(args, cfg, {"rows": rows}, TABLES)
