"""What the lower tiers (host, disk) store for a page (under ``cache.page_keys``' keys).

Payloads: page-first — all layers of one page together (K then V per layer, each
``[page_size, kv_heads, head_dim]``), so one read brings a page back whole.
"""

from __future__ import annotations

import numpy as np
import torch

from radixserve.memory.kv_pool import KVPool


def _pages(pool: KVPool, slots: np.ndarray) -> torch.Tensor:
    """The page numbers of ``slots`` (whole pages, in order)."""
    first = np.asarray(slots, dtype=np.int64)[:: pool.page_size] // pool.page_size
    return torch.from_numpy(first).to(pool.k[0].device)


def page_rows(pool: KVPool, slots: np.ndarray) -> torch.Tensor:
    """The pages at ``slots`` (whole pages, in order) as bytes, one row per page, on the
    pool's device (after any load into the pool still in flight)."""
    pool.wait_loads()
    pages = _pages(pool, slots)
    views = [pool.pages(layer) for layer in range(len(pool.k))]
    # [n, 2 * layers, page, heads, dim]: one copy, already page-first
    stacked = torch.stack([t[pages] for kv in views for t in kv], dim=1)
    return stacked.view(stacked.shape[0], -1).view(torch.uint8)


def gather_pages(pool: KVPool, slots: np.ndarray) -> np.ndarray:
    """``page_rows`` in host memory: a new array each call, so its rows can be handed to a
    writer while the pool moves on."""
    return page_rows(pool, slots).cpu().numpy()


def scatter_pages(
    pool: KVPool,
    slots: np.ndarray,
    rows: np.ndarray | torch.Tensor,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """Write page rows (as ``page_rows`` makes them, host or device) into the pages at
    ``slots``. With a CUDA ``stream``, the copy runs there, after what the current stream
    has queued (the slots may have been freed by work still running on it), and each layer
    records an event its forward waits for (``KVPool.write``): the copy overlaps the next
    forward's earlier layers instead of stalling it."""
    k0 = pool.k[0]
    shape = (len(rows), 2 * len(pool.k), pool.page_size, *k0.shape[1:])
    host = torch.as_tensor(rows)
    if stream is None:
        _scatter(pool, _pages(pool, slots), host.view(k0.dtype).view(shape).to(k0.device))
        return
    stream.wait_stream(torch.cuda.current_stream(k0.device))
    with torch.cuda.stream(stream):  # what it allocates stays the side stream's
        data = host.view(k0.dtype).view(shape).to(k0.device, non_blocking=True)
        _scatter(pool, _pages(pool, slots), data, stream)


def _scatter(pool: KVPool, pages: torch.Tensor, data: torch.Tensor, stream=None) -> None:
    for layer in range(len(pool.k)):
        k, v = pool.pages(layer)
        k[pages] = data[:, 2 * layer]
        v[pages] = data[:, 2 * layer + 1]
        if stream is not None:
            pool.loading[layer] = stream.record_event()


def page_bytes(pool: KVPool) -> int:
    k0 = pool.k[0]
    return 2 * len(pool.k) * pool.page_size * k0[0].numel() * k0.element_size()
