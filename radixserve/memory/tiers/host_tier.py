"""The host tier between a GPU engine's KV pool and the disk: pages leaving device memory are
copied into pinned host RAM, and copied back on a side stream when a prompt's prefix runs
past what the pool holds. When it is full, its least recently used pages go down to the
disk tier (if there is one), so each page is in device memory, host memory or on disk.

Host memory is one preallocated tensor of page rows, pinned on a CUDA engine (so copies
run asynchronously on the copy engines); a CPU engine's pool already lives in host memory,
where this tier only adds copies (it runs there in tests, through the same code).
Everything here runs on the thread that runs the model.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from radixserve.cache.page_keys import page_keys, root_key
from radixserve.memory.kv_pool import KVPool
from radixserve.memory.tiers.disk_tier import DiskTier
from radixserve.memory.tiers.pages import page_bytes, page_rows, scatter_pages


@dataclass
class HostStats:
    demoted_pages: int = 0  # copied in from the pool
    evicted_pages: int = 0  # pushed down to the disk tier, or dropped without one
    loaded_pages: int = 0  # copied out to be loaded into the pool


class HostTier:
    def __init__(
        self, pool: KVPool, capacity_bytes: int, fingerprint: str, below: DiskTier | None
    ) -> None:
        size = page_bytes(pool)
        if capacity_bytes < size:
            raise ValueError(f"host_cache_size_gb holds no page (one is {size} bytes)")
        self.pool = pool
        self.fingerprint = fingerprint
        self.below = below
        self.page_size = pool.page_size
        self.stats = HostStats()
        device = pool.k[0].device
        self.cuda = device.type == "cuda"
        self.buffer = torch.empty((capacity_bytes // size, size), dtype=torch.uint8)
        if self.cuda:
            self.buffer = self.buffer.pin_memory()
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        self._copied: torch.cuda.Event | None = None  # the last copy into the buffer
        self._rows: OrderedDict[bytes, int] = OrderedDict()  # key -> row, oldest use first
        self._free = list(range(len(self.buffer)))

    def keys(self, tokens: np.ndarray, namespace: object) -> list[bytes]:
        return page_keys(tokens, self.page_size, root_key(namespace, self.fingerprint))

    def demote(self, tokens: np.ndarray, slots: np.ndarray, namespace: object) -> None:
        """Copy in the pages ``slots`` holds: the last ``len(slots)`` tokens of ``tokens``
        (whole pages; the tokens before them name their keys)."""
        if not len(slots):
            return
        keys = self.keys(tokens, namespace)[-(len(slots) // self.page_size) :]
        fresh = []
        for i, key in enumerate(keys):
            if key in self._rows:
                self._rows.move_to_end(key)
            else:
                fresh.append(i)
        if not fresh:
            return
        page = self.page_size
        at = np.concatenate([slots[i * page : (i + 1) * page] for i in fresh])
        src = page_rows(self.pool, at)
        kept = len(self.buffer)  # more pages than the tier holds: the rest go down at once
        if len(fresh) > kept and self.below is not None:
            self.below.write([keys[i] for i in fresh[kept:]], src[kept:].cpu().numpy())
        fresh, src = fresh[:kept], src[:kept]
        self._make_room(len(fresh))
        for i, data in zip(fresh, src, strict=True):
            row = self._free.pop()
            # on the current stream, so the pool's slots are read before later work reuses them
            self.buffer[row].copy_(data, non_blocking=self.cuda)
            self._rows[keys[i]] = row
        self.stats.demoted_pages += len(fresh)
        if self.cuda:
            self._copied = torch.cuda.current_stream().record_event()

    def where(self, keys: list[bytes]) -> list[str]:
        """The tier of each of ``keys`` that can be loaded, from the first until one cannot."""
        out = []
        for key in keys:
            if key in self._rows:
                out.append("host")
            elif self.below is not None and key in self.below:
                out.append("disk")
            else:
                break
        return out

    def read_async(self, keys: list[bytes]) -> Future:
        """The rows of ``keys``: those in host memory copied out now (a later eviction may
        reuse their rows), the rest read from the disk tier; a future of the rows, or of None
        when a page is missing or fails its checksum."""
        self._settle()
        rows = torch.empty((len(keys), self.buffer.shape[1]), dtype=torch.uint8)
        if self.cuda:
            rows = rows.pin_memory()
        view = rows.numpy()
        on_disk = []
        for i, key in enumerate(keys):
            row = self._rows.get(key)
            if row is None:
                on_disk.append(i)
            else:
                self._rows.move_to_end(key)
                view[i] = self.buffer[row].numpy()
                self.stats.loaded_pages += 1
        if on_disk and self.below is not None:
            read = self.below.read_async([keys[i] for i in on_disk], view, on_disk)
            done: Future = Future()

            def finish(read: Future) -> None:
                if read.exception() is not None:
                    done.set_exception(read.exception())
                else:
                    done.set_result(None if read.result() is None else rows)

            read.add_done_callback(finish)
            return done
        done = Future()
        done.set_result(None if on_disk else rows)
        return done

    def install(self, slots: np.ndarray, rows: torch.Tensor) -> None:
        """Write read pages into the pool's ``slots``: on a GPU, on the side stream, layer by
        layer (the next forward waits for each layer's pages as it reaches it)."""
        scatter_pages(self.pool, slots, rows, self._stream)

    def snapshot(self) -> dict:
        out = self.below.snapshot() if self.below is not None else {}
        return out | {
            "host_pages": len(self._rows),
            "host_bytes_used": len(self._rows) * self.buffer.shape[1],
            "host_bytes_capacity": self.buffer.numel(),
            "host_pages_demoted": self.stats.demoted_pages,
            "host_pages_evicted": self.stats.evicted_pages,
            "host_pages_loaded": self.stats.loaded_pages,
        }

    def sync(self) -> None:
        """Return once every page here is also written to the disk tier (what a new process
        on the folder will find)."""
        if self.below is not None:
            self._write_down(list(self._rows.items()))
            self.below.sync()

    def close(self) -> None:
        """Hand every page to the disk tier, which writes what it is given and stops."""
        if self.below is not None:
            self._write_down(list(self._rows.items()))
            self.below.close()

    def _make_room(self, rows: int) -> None:
        """Free ``rows`` rows, the least recently used pages going down a tier."""
        evict = min(len(self._rows), max(0, rows - len(self._free)))
        if not evict:
            return
        victims = [self._rows.popitem(last=False) for _ in range(evict)]
        self._write_down(victims)
        self._free += [row for _, row in victims]
        self.stats.evicted_pages += evict

    def _write_down(self, pages: list[tuple[bytes, int]]) -> None:
        if self.below is None or not pages:
            return
        self._settle()
        rows = self.buffer[torch.tensor([row for _, row in pages])]  # a copy the writer keeps
        self.below.write([key for key, _ in pages], rows.numpy())

    def _settle(self) -> None:
        """Wait for copies into the buffer still running on the GPU."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None
