"""Owns the model, the KV pool and the attention backend; turns scheduled work into logits.

The only engine part that builds tensors: it reads token ids and slot indices off the
scheduled requests and hands the model a ``ForwardBatch``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
from radixserve.engine.schedule_batch import ScheduleBatch
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
        requests = [
            ExtendRequest(w.req.seq()[w.start : w.end], w.req.slots[: w.end]) for w in batch.work
        ]
        every = not batch.decode and any(w.req.params.prompt_logprobs for w in batch.work)
        groups = [PrefixGroup(n, tuple(members)) for n, members in batch.prefix_groups]
        fb = ForwardBatch.create(
            requests, self.config.page_size, self.device, every, groups, batch.kv_copies
        )
        logits = self.loaded.model(fb, self.backend)
        rows = [i for i, w in enumerate(batch.work) if w.samples]
        # a decode step samples every row: its logits need no copy
        last = logits.last if len(rows) == len(batch.work) else logits.last[rows]
        return ForwardOutput(last, [batch.work[i].req for i in rows], logits.all)


def _cpu_profile(pinned: CpuProfile | str | os.PathLike | None) -> CpuProfile:
    """The configured profile (checked to run here), or this machine's."""
    if pinned is None:
        return probe_cpu_profile()
    if isinstance(pinned, CpuProfile):
        check_runs_here(pinned)
        return pinned
    return load_profile(pinned)


@dataclass(frozen=True)
class ForwardOutput:
    """``last``: ``[n, vocab]`` logits of the requests in ``sampled`` (those whose pass reached
    their newest token); ``all``: ``[num_tokens, vocab]`` when prompt logprobs were asked."""

    last: torch.Tensor
    sampled: list[Req]
    all: torch.Tensor | None
