"""Per-request rows of KV slot indices.

Row ``r`` lists, position by position, the slot holding that token's K/V for the request that
owns the row. Attention metadata (page tables, gather indices) is built from these rows.
"""

from __future__ import annotations

import numpy as np


class OutOfRows(RuntimeError):
    """Raised when every request row is taken."""


class ReqToTokenTable:
    """A fixed ``[max_requests, max_context_len]`` table of slot ids with a free-row pool."""

    def __init__(self, max_requests: int, max_context_len: int) -> None:
        if max_requests < 1 or max_context_len < 1:
            raise ValueError(
                f"max_requests and max_context_len must be >= 1, got {max_requests}, "
                f"{max_context_len}"
            )
        self.max_requests = max_requests
        self.max_context_len = max_context_len
        self.table = np.zeros((max_requests, max_context_len), dtype=np.int64)
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self._in_use = np.zeros(max_requests, dtype=bool)

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int:
        """Take a free row; raises ``OutOfRows`` when none is left."""
        if not self._free_rows:
            raise OutOfRows(f"all {self.max_requests} request rows are in use")
        row = self._free_rows.pop()
        self._in_use[row] = True
        return row

    def free(self, row: int) -> None:
        self._check_row(row)
        self._in_use[row] = False
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: np.ndarray | list[int]) -> None:
        """Store ``slots`` at positions ``start .. start+len(slots)-1`` of ``row``."""
        self._check_row(row)
        slots = np.asarray(slots, dtype=np.int64)
        end = start + slots.size
        if start < 0 or end > self.max_context_len:
            raise ValueError(
                f"positions [{start}, {end}) fall outside the context window "
                f"of {self.max_context_len}"
            )
        self.table[row, start:end] = slots

    def read(self, row: int, end: int, start: int = 0) -> np.ndarray:
        """The slots at positions ``start .. end-1`` of ``row`` (a view, do not keep it)."""
        self._check_row(row)
        if not 0 <= start <= end <= self.max_context_len:
            raise ValueError(f"bad position range [{start}, {end})")
        return self.table[row, start:end]

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.max_requests or not self._in_use[row]:
            raise ValueError(f"request row {row} is not allocated")
