"""The K/V tensors of every layer, indexed by slot.

Layer ``l``'s keys are one tensor ``[num_slots, kv_heads, head_dim]``; because slots come in
whole pages, the same storage is viewable as ``[num_pages, page_size, kv_heads, head_dim]``,
the layout paged kernels (FlashInfer's "NHD") read.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_slots % page_size:
            raise ValueError(f"num_slots {num_slots} is not a multiple of page_size {page_size}")
        self.num_slots = num_slots
        self.page_size = page_size
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # per layer, the CUDA event of a load from a lower tier still running on a side
        # stream: the forward's layer waits for its own layer's pages only
        self.loading: list[torch.cuda.Event | None] = [None] * num_layers

    @staticmethod
    def bytes_per_slot(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        copies: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Store new tokens' K/V (``[num_tokens, kv_heads, head_dim]``) at ``slots`` (every
        layer's attention calls this before reading the pool). ``copies``: ``(src, dst)``
        slots whose cached K/V this pass reads from new places; copied first, layer by
        layer, after the layer's loads from a lower tier (a source may be among them)."""
        self._wait_load(layer)
        if copies is not None:
            src, dst = copies
            self.k[layer][dst] = self.k[layer][src]
            self.v[layer][dst] = self.v[layer][src]
        self.k[layer][slots] = k
        self.v[layer][slots] = v

    def pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s K and V as ``[num_pages, page_size, kv_heads, head_dim]`` views."""
        k, v = self.k[layer], self.v[layer]
        shape = (self.num_slots // self.page_size, self.page_size, *k.shape[1:])
        return k.view(shape), v.view(shape)

    def wait_loads(self) -> None:
        """Order what runs next on the current stream after every load in flight."""
        for layer in range(len(self.loading)):
            self._wait_load(layer)

    def _wait_load(self, layer: int) -> None:
        event = self.loading[layer]
        if event is not None:
            torch.cuda.current_stream().wait_event(event)
            self.loading[layer] = None
