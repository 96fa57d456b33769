"""What the disk tier stores for a page, and under which key.

Keys: a hash chain over the token ids, page by page, from a root salted by the namespace and
the store's fingerprint (model, dtype, page size, layout), so a key names one page *and
everything before it*, and nothing crosses tenants or models.

Payloads: page-first — all layers of one page together (K then V per layer, each
``[page_size, kv_heads, head_dim]``), so one read brings a page back whole.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from radixserve.memory.kv_pool import KVPool
from radixserve.memory.tiers.disk_store import KEY_BYTES


def root_key(namespace: object, fingerprint: str) -> bytes:
    return hashlib.blake2b(f"{fingerprint}|{namespace!r}".encode(), digest_size=KEY_BYTES).digest()


def page_keys(tokens: np.ndarray, page_size: int, root: bytes) -> list[bytes]:
    """One key per whole page of ``tokens``."""
    data = np.ascontiguousarray(tokens, dtype=np.int32).tobytes()
    step = 4 * page_size
    keys, prev = [], root
    for start in range(0, len(data) - len(data) % step, step):
        prev = hashlib.blake2b(prev + data[start : start + step], digest_size=KEY_BYTES).digest()
        keys.append(prev)
    return keys


def _pages(pool: KVPool, slots: np.ndarray) -> torch.Tensor:
    """The page numbers of ``slots`` (whole pages, in order)."""
    first = np.asarray(slots, dtype=np.int64)[:: pool.page_size] // pool.page_size
    return torch.from_numpy(first).to(pool.k[0].device)


def gather_pages(pool: KVPool, slots: np.ndarray) -> list[bytes]:
    """The payloads of the pages at ``slots`` (whole pages, in order)."""
    pages = _pages(pool, slots)
    views = [pool.pages(layer) for layer in range(len(pool.k))]
    # [n, 2 * layers, page, heads, dim]: one copy, already page-first
    stacked = torch.stack([t[pages] for kv in views for t in kv], dim=1).cpu()
    flat = stacked.view(stacked.shape[0], -1).view(torch.uint8).numpy()
    return [row.tobytes() for row in flat]


def scatter_pages(pool: KVPool, slots: np.ndarray, payloads: list[bytes]) -> None:
    """Write ``payloads`` (from ``gather_pages``) into the pages at ``slots``."""
    pages = _pages(pool, slots)
    k0 = pool.k[0]
    raw = np.empty((len(payloads), len(payloads[0])), dtype=np.uint8)
    for row, payload in zip(raw, payloads, strict=True):
        row[:] = np.frombuffer(payload, dtype=np.uint8)
    shape = (len(payloads), 2 * len(pool.k), pool.page_size, *k0.shape[1:])
    data = torch.from_numpy(raw).view(k0.dtype).view(shape).to(k0.device)
    for layer in range(len(pool.k)):
        k, v = pool.pages(layer)
        k[pages] = data[:, 2 * layer]
        v[pages] = data[:, 2 * layer + 1]


def page_bytes(pool: KVPool) -> int:
    k0 = pool.k[0]
    return 2 * len(pool.k) * pool.page_size * k0[0].numel() * k0.element_size()
