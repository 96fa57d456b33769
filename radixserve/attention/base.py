"""The attention backend interface.

A backend stores each layer's new K/V in the pool and attends each request's new queries
over its whole context (cached prefix + new tokens), causally and bottom-right aligned:
query ``i`` of an extend over ``prefix_len`` cached tokens sees keys ``0 .. prefix_len + i``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from radixserve.attention.forward_batch import ForwardBatch
from radixserve.cache.shared_paths import PrefixGroupRule
from radixserve.memory.kv_pool import KVPool


class AttentionBackend(ABC):
    name: str

    def __init__(
        self, kv_pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int, scale: float
    ) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} KV heads")
        self.kv_pool = kv_pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale

    def prefix_group_rule(self, min_shared: int) -> PrefixGroupRule | None:
        """The groups this backend reads a shared prefix once for, when asked to group at
        ``min_shared`` tokens; ``None``: it reads every request's context on its own."""
        return None

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Build ``batch.attn_metadata`` once per forward; every layer reuses it."""

    @abstractmethod
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """Write ``k``/``v`` (``[num_tokens, kv_heads, head_dim]``) at ``batch.out_slots`` and
        return attention of ``q`` (``[num_tokens, heads, head_dim]``) in the same layout."""
