"""The disk tier under the KV pool: pages leaving the pool are copied out at once and written
by a writer thread; a prompt whose prefix runs past what the pool holds has the rest read
back by a reader thread while the scheduler serves the others, then installed in the pool.

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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from radixserve.cache.page_keys import page_keys, root_key
from radixserve.memory.kv_pool import KVPool
from radixserve.memory.tiers.disk_store import DiskStore
from radixserve.memory.tiers.pages import gather_pages, page_bytes, scatter_pages

logger = logging.getLogger(__name__)
QUEUE_PAGES = 512
LAYOUT = "pagefirst1"  # what pages.py writes; part of every folder's fingerprint
IDLE_SEAL_S = 0.5  # a writer idle this long seals what it wrote (it survives a restart)


@dataclass
class TierStats:
    demoted_pages: int = 0
    dropped_writes: int = 0  # the writer's queue was full
    loaded_pages: int = 0  # read back, checked
    read_s: float = 0.0  # on the reader thread
    load_s: float = 0.0  # installing what was read, on the model's thread


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
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="radixserve-disk-read")
        # The buffer of the last installed read, reused by the next: a fresh one faults in
        # each of its pages while it is filled, which cost a read several times its copy.
        # It holds at most one read's rows.
        self._spare: np.ndarray | None = None

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
        self.write([keys[i] for i in fresh], gather_pages(self.pool, rows))

    def write(self, keys: list[bytes], rows: np.ndarray) -> None:
        """Queue page rows (``gather_pages``'s, not used again by the caller) for writing
        under ``keys``."""
        for key, row in zip(keys, rows, strict=True):
            if self.failed or key in self.store:
                continue
            try:
                self._queue.put_nowait((key, memoryview(row)))
                self.stats.demoted_pages += 1
            except queue.Full:
                self.stats.dropped_writes += 1

    def __contains__(self, key: bytes) -> bool:
        return not self.failed and key in self.store

    def where(self, keys: list[bytes]) -> list[str]:
        """The tier of each of ``keys`` that can be loaded, from the first until one cannot."""
        return [] if self.failed else ["disk"] * self.store.stored_prefix(keys)

    def read_async(
        self, keys: list[bytes], rows: np.ndarray | None = None, at: list[int] | None = None
    ) -> Future:
        """Read the pages of ``keys`` on the reader thread (into ``rows[at[i]]`` when given):
        a future of the rows (one per page, as ``gather_pages`` makes them), or of None when
        one is missing or fails its checksum (all of them, or none)."""
        if rows is None:
            rows = self._buffer(len(keys))
        return self._reader.submit(self._read, keys, rows, at or range(len(keys)))

    def install(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Write read pages into the pool's ``slots`` (on the thread that runs the model:
        a torch op on another thread would start a second OpenMP team)."""
        t0 = time.perf_counter()
        scatter_pages(self.pool, slots, rows)
        self.stats.load_s += time.perf_counter() - t0
        while isinstance(rows.base, np.ndarray):  # the whole buffer a slice of it came from
            rows = rows.base
        if self._spare is None or len(rows) > len(self._spare):
            self._spare = rows

    def _buffer(self, pages: int) -> np.ndarray:
        """Rows for a read: the spare buffer when it is large enough (it is then the read's
        until installed), else new ones."""
        spare = self._spare
        if spare is not None and len(spare) >= pages:
            self._spare = None
            return spare[:pages]
        return np.empty((pages, page_bytes(self.pool)), dtype=np.uint8)

    def _read(self, keys: list[bytes], rows: np.ndarray, at) -> np.ndarray | None:
        t0 = time.perf_counter()
        ok = all(self.store.get_into(k, memoryview(rows[i])) for k, i in zip(keys, at, strict=True))
        self.stats.read_s += time.perf_counter() - t0
        self.stats.loaded_pages += len(keys) if ok else 0
        return rows if ok else None

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
            "disk_read_s": t.read_s,
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
        self._reader.shutdown(wait=True, cancel_futures=True)
        self._queue.put(None)
        self._thread.join()
        try:
            self.store.close()
        except OSError as exc:
            if not self.failed:
                logger.error("disk cache disabled: %s", exc)
            self.failed = True

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
