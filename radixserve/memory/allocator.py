"""Page-granular allocator of KV slots.

A slot holds one token's K and V for every layer and KV head. Slots are handed out in whole
pages (page ``p`` owns slots ``p*P .. p*P+P-1``) so the same KV buffer can be viewed as
``[num_pages, P, kv_heads, head_dim]`` by paged attention kernels.

Slot arrays are 1-D ``numpy.int64`` arrays: building them is cheap, and ``torch.from_numpy``
turns one into a CPU tensor without a copy (``torch.tensor(list)`` loops over Python ints).
"""

from __future__ import annotations

import numpy as np


class OutOfSlots(RuntimeError):
    """Raised when an allocation asks for more slots than are free."""


class KVSlotAllocator:
    """Hands out KV slots in whole pages and takes them back.

    Freed pages are reused last-in first-out, so recently touched memory is reused first.
    """

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_slots < page_size or num_slots % page_size:
            raise ValueError(
                f"num_slots must be a positive multiple of page_size={page_size}, got {num_slots}"
            )
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self._page_offsets = np.arange(page_size, dtype=np.int64)
        self.reset()

    @property
    def capacity(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free(self) -> int:
        return self._num_free_pages * self.page_size

    @property
    def num_used(self) -> int:
        return self.capacity - self.num_free

    def slots_needed(self, num_tokens: int) -> int:
        """Slots an allocation of ``num_tokens`` takes: whole pages, rounded up."""
        return -(-num_tokens // self.page_size) * self.page_size

    def alloc(self, num_tokens: int) -> np.ndarray:
        """Return ``ceil(num_tokens / P) * P`` free slots, whole pages in page order.

        Raises ``OutOfSlots`` (and allocates nothing) when not enough pages are free.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        num_pages = -(-num_tokens // self.page_size)
        if num_pages > self._num_free_pages:
            raise OutOfSlots(
                f"need {num_pages * self.page_size} slots ({num_pages} pages of "
                f"{self.page_size}), only {self.num_free} of {self.capacity} are free"
            )
        top = self._num_free_pages
        pages = self._free_pages[top - num_pages : top][::-1].copy()
        self._num_free_pages = top - num_pages
        self._allocated[pages] = True
        return self.pages_to_slots(pages)

    def free(self, slots: np.ndarray | list[int]) -> None:
        """Return the pages that ``slots`` lie in to the free pool.

        Raises ``ValueError`` and frees nothing when a slot is out of range or listed twice,
        or its page is not allocated.
        """
        if self._free_one_page(slots):
            return
        pages = self._pages_of(self._checked(slots))
        if not self._allocated[pages].all():
            bad = pages[~self._allocated[pages]][:8].tolist()
            raise ValueError(f"freeing pages that are not allocated: {bad}")
        self._allocated[pages] = False
        top = self._num_free_pages
        self._free_pages[top : top + pages.size] = pages[::-1]
        self._num_free_pages = top + pages.size

    def _free_one_page(self, slots: np.ndarray | list[int]) -> bool:
        """Free exactly one allocated page's slots, in order (the tree evicting a one-page
        leaf), with Python scalars: on arrays this small numpy's cost per call is what counts.
        False, having changed nothing, for anything else."""
        size = self.page_size
        if not isinstance(slots, np.ndarray) or slots.shape != (size,) or slots.dtype.kind != "i":
            return False
        ids = slots.tolist()
        first = ids[0]
        if first % size or not 0 <= first < self.capacity:
            return False
        if size > 1 and ids != list(range(first, first + size)):
            return False
        page = first // size
        if not self._allocated[page]:
            return False  # the general path names the page
        self._allocated[page] = False
        self._free_pages[self._num_free_pages] = page
        self._num_free_pages += 1
        return True

    def is_allocated(self, slots: np.ndarray | list[int]) -> bool:
        """True when every slot lies in range and in an allocated page."""
        try:
            slots = self._checked(slots)
        except ValueError:
            return False
        return bool(self._allocated[slots // self.page_size].all())

    def pages_to_slots(self, pages: np.ndarray) -> np.ndarray:
        return (pages[:, None] * self.page_size + self._page_offsets).reshape(-1)

    def reset(self) -> None:
        """Forget every allocation: all pages become free, page 0 first."""
        # A stack of free page ids; its top is at index _num_free_pages - 1.
        self._free_pages = np.arange(self.num_pages - 1, -1, -1, dtype=np.int64)
        self._num_free_pages = self.num_pages
        self._allocated = np.zeros(self.num_pages, dtype=bool)

    def _pages_of(self, slots: np.ndarray) -> np.ndarray:
        """The distinct pages ``slots`` lie in; raises if a slot is listed twice. Whole pages
        slot by slot in order (what ``alloc`` hands out and the tree keeps, a leaf's page at a
        time when it evicts) take one comparison; any other list, a sort."""
        size = self.page_size
        if slots.size % size == 0:
            rows = slots.reshape(-1, size)
            pages = rows[:, 0] // size
            in_order = size == 1 or (rows == pages[:, None] * size + self._page_offsets).all()
            if in_order and (pages.size == 1 or _distinct(pages)):
                return pages
        if np.unique(slots).size != slots.size:
            raise ValueError("the same slot is listed twice")
        return np.unique(slots // size)

    def _checked(self, slots: np.ndarray | list[int]) -> np.ndarray:
        slots = np.asarray(slots)
        if slots.size == 0:
            return np.empty(0, dtype=np.int64)
        if slots.ndim != 1 or slots.dtype.kind not in "iu":
            raise ValueError("slots must be a 1-D sequence of integers")
        # One reduction: a negative slot read as unsigned is past any capacity.
        if np.maximum.reduce(slots.view(slots.dtype.str.replace("i", "u"))) >= self.capacity:
            raise ValueError(f"slot out of range [0, {self.capacity})")
        return slots


def _distinct(values: np.ndarray) -> bool:
    """No value twice: array methods only (``np.unique`` costs several µs of Python per call
    on a few values)."""
    ordered = values.copy()
    ordered.sort()
    return bool((ordered[1:] != ordered[:-1]).all())
