"""Drive our decoder over a paged KV pool the way the engine will: sequences own whole pages,
and a sequence can start from another's cached prefix."""

from __future__ import annotations

import numpy as np
import torch

from radixserve.attention import ExtendRequest, ForwardBatch, create_attention_backend
from radixserve.cpu import probe_cpu_profile
from radixserve.memory import KVSlotAllocator
from radixserve.memory.kv_pool import KVPool
from radixserve.model import LoadedModel


class Sequence:
    """A request's tokens and slots: ``slots[i]`` holds token ``i``'s K/V."""

    def __init__(self, runner: PagedRunner, ids=(), slots=None) -> None:
        self.runner = runner
        self.ids = list(ids)
        self.slots = np.empty(0, np.int64) if slots is None else np.asarray(slots, np.int64)

    def fork(self, length: int) -> Sequence:
        """A new sequence that reuses this one's first ``length`` tokens (whole pages) of KV."""
        assert length % self.runner.page_size == 0
        return Sequence(self.runner, self.ids[:length], self.slots[:length])

    def grow(self, new_ids) -> ExtendRequest:
        page = self.runner.page_size
        old, new = len(self.ids), len(self.ids) + len(new_ids)
        # Fill the last partial page first, then take whole new pages.
        room = -old % page
        fresh = self.runner.allocator.alloc(max(0, len(new_ids) - room))
        tail = self.slots[-1] + 1 + np.arange(min(room, len(new_ids))) if room else []
        self.slots = np.concatenate([self.slots, np.asarray(tail, np.int64), fresh])[:new]
        self.ids += list(new_ids)
        return ExtendRequest(list(new_ids), self.slots.copy())


class PagedRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        page_size: int = 1,
        num_slots: int = 8192,
        backend: str = "torch",
        device: str = "cpu",
    ) -> None:
        cfg = loaded.config
        self.model = loaded.model
        self.page_size = page_size
        dtype = next(self.model.parameters()).dtype
        self.allocator = KVSlotAllocator(num_slots, page_size)
        self.pool = KVPool(
            cfg.num_layers, num_slots, page_size, cfg.num_kv_heads, cfg.head_dim, dtype, device
        )
        profile = probe_cpu_profile() if device == "cpu" else None
        if profile is not None and self.model.cpu_profile is None:
            self.model.use_cpu_profile(profile, pack_weights=False)  # as an engine would
        self.backend = create_attention_backend(
            backend,
            self.pool,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.head_dim**-0.5,
            profile,
        )
        self.device = device

    def new(self) -> Sequence:
        return Sequence(self)

    def extend(self, work: list[tuple[Sequence, list[int]]], all_logits: bool = False):
        batch = ForwardBatch.create(
            [seq.grow(ids) for seq, ids in work], self.page_size, self.device, all_logits
        )
        return self.model(batch, self.backend)

    def greedy(self, seq: Sequence, prompt: list[int], steps: int) -> list[int]:
        out = []
        logits = self.extend([(seq, prompt)]).last
        for _ in range(steps):
            token = int(torch.argmax(logits[0]))
            out.append(token)
            logits = self.extend([(seq, [token])]).last
        return out


def hf_greedy(hf, ids: list[int], steps: int) -> list[int]:
    """transformers' greedy continuation of ``ids``: exactly ``steps`` tokens."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()
