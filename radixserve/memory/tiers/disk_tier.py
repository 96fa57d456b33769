"""The disk tier under the KV pool: pages leaving the pool are copied out at once and written
by a writer thread; a prompt whose prefix runs past what the pool holds reads the rest back.

Copying a page out of the pool is a memory copy on the caller's thread (the pool's slots
may be reused the moment eviction returns); the disk write is the writer thread's, through a
bounded queue (when it is full the page is not written: the cache is an optimisation). A
page is found by its key (``pages.py``), so a new process on the same folder finds what an
earlier one wrote: the tree need not know of it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from radixserve.memory.kv_pool import KVPool
from radixserve.memory.tiers.disk_store import DiskStore
from radixserve.memory.tiers.pages import gather_pages, page_keys, root_key, scatter_pages

logger = logging.getLogger(__name__)
QUEUE_PAGES = 512
LAYOUT = "pagefirst1"  # what pages.py writes; part of every folder's fingerprint
IDLE_SEAL_S = 0.5  # a writer idle this long seals what it wrote (it survives a restart)


@dataclass
class TierStats:
    demoted_pages: int = 0
    dropped_writes: int = 0  # the writer's queue was full
    loaded_pages: int = 0
    load_s: float = 0.0


class DiskTier:
    def __init__(self, pool: KVPool, store: DiskStore, fingerprint: str) -> None:
        self.pool = pool
        self.store = store
        self.fingerprint = fingerprint
        self.page_size = pool.page_size
        self.stats = TierStats()
        self.failed = False
        self._queue: queue.Queue = queue.Queue(QUEUE_PAGES)
        self._thread = threading.Thread(target=self._write, name="radixserve-disk", daemon=True)
        self._thread.start()

    def keys(self, tokens: np.ndarray, namespace: object) -> list[bytes]:
        return page_keys(tokens, self.page_size, root_key(namespace, self.fingerprint))

    def demote(self, tokens: np.ndarray, slots: np.ndarray, namespace: object) -> None:
        """Queue for writing the pages ``slots`` holds: the last ``len(slots)`` tokens of
        ``tokens`` (whole pages; the tokens before them name their keys)."""
        if self.failed or not len(slots):
            return
        keys = self.keys(tokens, namespace)[-(len(slots) // self.page_size) :]
        fresh = [i for i, k in enumerate(keys) if k not in self.store]
        if not fresh:
            return
        page = self.page_size
        rows = np.concatenate([slots[i * page : (i + 1) * page] for i in fresh])
        for i, payload in zip(fresh, gather_pages(self.pool, rows), strict=True):
            try:
                self._queue.put_nowait((keys[i], payload))
                self.stats.demoted_pages += 1
            except queue.Full:
                self.stats.dropped_writes += 1

    def stored_pages(self, keys: list[bytes]) -> int:
        """How many of ``keys``, from the first, can be loaded."""
        return 0 if self.failed else self.store.stored_prefix(keys)

    def load(self, keys: list[bytes], slots: np.ndarray) -> bool:
        """Read the pages of ``keys`` into ``slots``: all of them, or none (False) when one
        is missing or fails its checksum."""
        t0 = time.perf_counter()
        payloads = [self.store.get(k) for k in keys]
        if any(p is None for p in payloads):
            return False
        scatter_pages(self.pool, slots, payloads)
        self.stats.loaded_pages += len(keys)
        self.stats.load_s += time.perf_counter() - t0
        return True

    def snapshot(self) -> dict:
        s, t = self.store.stats, self.stats
        return {
            "disk_pages": s.pages,
            "disk_bytes_used": s.bytes_used,
            "disk_bytes_written": s.bytes_written,
            "disk_bytes_read": s.bytes_read,
            "disk_pages_corrupted": s.corrupted_pages,
            "disk_pages_evicted": s.evicted_pages,
            "disk_pages_demoted": t.demoted_pages,
            "disk_writes_dropped": t.dropped_writes,
            "disk_pages_loaded": t.loaded_pages,
            "disk_load_s": t.load_s,
            "disk_failed": self.failed,
        }

    def sync(self) -> None:
        """Return once everything queued so far is written and sealed."""
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def close(self) -> None:
        """Write what is queued, seal it, and stop the writer."""
        self._queue.put(None)
        self._thread.join()
        self.store.close()

    def _write(self) -> None:
        """Items: (key, payload) to store; an Event to seal and set; None to seal and stop;
        an idle spell seals too."""
        dirty = False
        while True:
            try:
                item = self._queue.get(timeout=IDLE_SEAL_S if dirty else None)
            except queue.Empty:
                item = "idle"
            try:
                if isinstance(item, tuple):
                    if not self.failed:
                        self.store.put(*item)
                        dirty = True
                elif dirty and not self.failed:
                    dirty = False
                    self.store.flush()
            except OSError as exc:  # a full or vanished disk: serve from memory only
                logger.error("disk cache disabled: %s", exc)
                self.failed = True
            finally:
                if isinstance(item, threading.Event):
                    item.set()
            if item is None:
                return
