"""Keep freed host memory in the process, so a forward pass's temporaries reuse pages.

A prefill step allocates and frees megabytes per operation (a 2,048-token MLP activation is
12 MB in float32). glibc serves such blocks with ``mmap`` and returns them with ``munmap``,
so every operation starts on fresh pages that the kernel must fault in and zero, a large
share of a long prefill step's time. Raising the mmap
and trim thresholds keeps those blocks in the heap for the next operation (vLLM's CPU image
gets the same effect by preloading tcmalloc).

Threads share one arena too. A thread other than the main one gets its own arena, made of
heaps of at most 64 MB that glibc unmaps whenever one empties, whatever the trim threshold:
a step's large temporaries on the compute thread then came back on fresh pages in some
processes and not in others (49,000-280,000 faults per multi-turn-chat round against none).
The main arena grows one heap and trims it only above the threshold. A thread that already
allocated keeps its arena, so this runs before the engine starts its threads.
Process-wide and glibc-only; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# glibc caps the mmap threshold at half its 64 MB heap size: blocks up to 32 MB stay in heaps
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's thresholds and keep one arena, once per process; whether it took effect."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): nothing to tune
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    settings = (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (M_ARENA_MAX, 1),
    )
    return all([bool(mallopt(option, value)) for option, value in settings])  # every one
