"""Validation of the slots a caller hands to a prefix cache, shared by every index."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixserve.memory import KVSlotAllocator

EMPTY_SLOTS = np.empty(0, dtype=np.int64)


def check_slots(slots: Sequence[int] | np.ndarray, num_tokens: int) -> np.ndarray:
    """``slots`` as int64, one non-negative slot per token; ``ValueError`` otherwise."""
    arr = np.asarray(slots)
    if arr.size == 0 and num_tokens == 0:
        return EMPTY_SLOTS
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError("slots must be a 1-D sequence of ints")
    if arr.size != num_tokens:
        raise ValueError(f"got {arr.size} slots for {num_tokens} tokens")
    if arr.min() < 0:
        raise ValueError("slots must be non-negative")
    return arr.astype(np.int64, copy=False)


def check_whole_pages(slots: np.ndarray, allocator: KVSlotAllocator) -> None:
    """Slots a cache adopts must be allocated and come in whole, ordered pages."""
    if not allocator.is_allocated(slots):
        raise ValueError("slots must be allocated by this cache's allocator")
    page = allocator.page_size
    if page == 1:
        return
    pages = slots.reshape(-1, page)
    if (pages[:, 0] % page).any() or (np.diff(pages, axis=1) != 1).any():
        raise ValueError(f"slots must come in whole pages of {page}, in order")


def check_page_size(page_size: int, allocator: KVSlotAllocator | None) -> None:
    """A cache and its allocator must agree on the page size."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if allocator is not None and allocator.page_size != page_size:
        raise ValueError(
            f"allocator pages hold {allocator.page_size} slots, the cache's {page_size}"
        )
