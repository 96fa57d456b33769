"""Owns the model, the KV pool and the attention backend; turns scheduled work into logits.

The only engine part that builds tensors: it reads token ids and slot indices off the
scheduled requests and hands the model a ``ForwardBatch``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch

from radixserve.attention import (
    ExtendRequest,
    ForwardBatch,
    PrefixGroup,
    create_attention_backend,
)
from radixserve.cpu import CpuProfile, load_profile, probe_cpu_profile
from radixserve.cpu.profile import check_runs_here
from radixserve.engine.config import EngineConfig
from radixserve.engine.req import Req
from radixserve.engine.scheduler.batch import ScheduleBatch, Work
from radixserve.memory.kv_pool import KVPool
from radixserve.model import load_model


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.loaded = load_model(
            config.model, getattr(torch, config.dtype), self.device, config.quantize
        )
        self.cpu_profile = _cpu_profile(config.cpu_profile) if self.device.type == "cpu" else None
        if self.cpu_profile is not None:
            self.loaded.model.use_cpu_profile(self.cpu_profile, config.pack_weights)
        cfg = self.loaded.config
        self.num_slots = self._pool_slots()
        self.pool = KVPool(
            cfg.num_layers,
            self.num_slots,
            config.page_size,
            cfg.num_kv_heads,
            cfg.head_dim,
            getattr(torch, config.dtype),
            self.device,
        )
        self.backend = create_attention_backend(
            config.attention_backend,
            self.pool,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.head_dim**-0.5,
            self.cpu_profile,
        )

    def _pool_slots(self) -> int:
        """KV slots to allocate: as configured, or ``mem_fraction`` of the free memory of the
        device (host memory on CPU), in whole pages."""
        config, cfg = self.config, self.loaded.config
        if config.mem_fraction is None:
            slots = config.max_total_tokens or 65536
        else:
            if self.device.type == "cuda":
                free = torch.cuda.mem_get_info(self.device)[0]
            else:
                free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            per_slot = KVPool.bytes_per_slot(
                cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, getattr(torch, config.dtype)
            )
            slots = int(free * config.mem_fraction) // per_slot
        slots -= slots % config.page_size
        if slots < 4 * config.page_size:
            raise ValueError(f"only {slots} KV slots fit; give more memory")
        return slots

    def forward(self, batch: ScheduleBatch) -> ForwardOutput:
        requests = [ExtendRequest(_new_ids(w), w.req.kv.slots[: w.end]) for w in batch.work]
        every = not batch.decode and any(w.req.params.prompt_logprobs for w in batch.work)
        groups = [PrefixGroup(n, tuple(members)) for n, members in batch.prefix_groups]
        counts = [1 + len(w.draft) for w in batch.work]
        fb = ForwardBatch.create(
            requests,
            self.config.page_size,
            self.device,
            every,
            groups,
            batch.kv_copies,
            counts if any(n > 1 for n in counts) else None,
        )
        logits = self.loaded.model(fb, self.backend)
        rows, drafted, at = [], [], 0
        for w, n in zip(batch.work, counts, strict=True):
            if w.draft:
                drafted.append(Drafted(w.req, w.draft, logits.last[at : at + n]))
            elif w.samples:
                rows.append(at)
            at += n
        # a decode step samples every row: its logits need no copy
        last = logits.last if len(rows) == len(logits.last) else logits.last[rows]
        sampled = [w.req for w in batch.work if w.samples and not w.draft]
        return ForwardOutput(last, sampled, logits.all, drafted)


def _new_ids(work: Work) -> np.ndarray:
    """The token ids a request's pass computes: its span of the sequence, then its draft."""
    ids = work.req.seq()[work.start : work.end - len(work.draft)]
    if not work.draft:
        return ids
    return np.concatenate([ids, np.asarray(work.draft, dtype=np.int32)])


def _cpu_profile(pinned: CpuProfile | str | os.PathLike | None) -> CpuProfile:
    """The configured profile (checked to run here), or this machine's."""
    if pinned is None:
        return probe_cpu_profile()
    if isinstance(pinned, CpuProfile):
        check_runs_here(pinned)
        return pinned
    return load_profile(pinned)


@dataclass(frozen=True)
class Drafted:
    """A request that verified ``draft``: ``logits[j]`` is the distribution of the token
    after its last one and the first ``j`` draft tokens."""

    req: Req
    draft: tuple[int, ...]
    logits: torch.Tensor


@dataclass(frozen=True)
class ForwardOutput:
    """``last``: ``[n, vocab]`` logits of the requests in ``sampled`` (those whose pass reached
    their newest token, drafts aside); ``all``: ``[num_tokens, vocab]`` when prompt logprobs
    were asked; ``drafted``: the requests that verified drafts."""

    last: torch.Tensor
    sampled: list[Req]
    all: torch.Tensor | None
    drafted: list[Drafted] = field(default_factory=list)
