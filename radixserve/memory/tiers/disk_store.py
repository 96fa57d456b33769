"""A directory of KV pages that outlives the process: the disk tier's storage.

Pages are opaque payloads (all layers of one page together) under 16-byte keys (hash chains
of token ids, ``cache/page_keys.py``). They are appended to segment files, not written one file
each: a segment fills in memory and is written whole to a temporary file and renamed when
it is sealed (full, or on ``flush``), so a crash loses at most the unsealed pages and never
leaves half a segment under a real name. Each record carries a checksum verified on every
read: a corrupted page is dropped, counted and reported missing, never returned. A new
process rebuilds the index by scanning the sealed segments' record headers.

Layout: ``DIR/<fingerprint>/seg-<n>.bin``, one folder per model/dtype/page layout
(``fingerprint``), so another model's pages are never even read. The folder is bounded by
``capacity_bytes``: past it, whole segments go, the least recently used first. Folders and
files are created readable by their owner only.

    record = MAGIC (4) | key (16) | payload length (4, little-endian) | CRC-32 (8) | payload
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from radixserve.cache.page_keys import KEY_BYTES

MAGIC = b"RXKV"
_HEADER = struct.Struct("<4s16sI8s")
SEGMENT_BYTES = 64 << 20
IOV_MAX = 512  # pieces per writev (the OS allows at least 1,024)


def checksum(payload: bytes | memoryview) -> bytes:
    """CRC-32 (zlib's, several GB/s): it guards against torn and flipped bytes, not
    against someone who can write the folder."""
    return zlib.crc32(payload).to_bytes(8, "little")


def _write_all(fd: int, pieces: list[bytes | memoryview]) -> None:
    for start in range(0, len(pieces), IOV_MAX):
        chunk = pieces[start : start + IOV_MAX]
        written = os.writev(fd, chunk)
        rest = memoryview(b"".join(chunk))[written:] if written < sum(map(len, chunk)) else b""
        while rest:  # a short write (rare on files): the rest piece by piece
            rest = rest[os.write(fd, rest) :]


@dataclass
class _Record:
    segment: int  # -1: still in the open segment
    offset: int  # of the payload
    length: int
    digest: bytes


@dataclass
class DiskStats:
    pages: int = 0
    bytes_used: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    corrupted_pages: int = 0
    evicted_pages: int = 0


class DiskStore:
    def __init__(
        self,
        directory: str | Path,
        fingerprint: str,
        capacity_bytes: int,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        """Opens (or creates) the folder; ``OSError`` when it cannot be written."""
        if capacity_bytes < segment_bytes:
            segment_bytes = max(capacity_bytes // 2, 1)
        self.capacity_bytes = capacity_bytes
        self.segment_bytes = segment_bytes
        self.root = Path(directory) / fingerprint
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        probe = self.root / ".probe"
        probe.touch(mode=0o600)
        probe.unlink()
        self._lock = threading.Lock()
        self._index: dict[bytes, _Record] = {}
        self._segments: dict[int, dict] = {}  # n -> {"bytes", "keys", "used"}
        # The open segment: its pieces (headers and payloads, written with one writev when
        # sealed: no copy into a buffer, which would hold the GIL while a forward runs) and
        # its payloads by key, for reads before then.
        self._open: list[bytes | memoryview] = []
        self._open_bytes = 0
        self._open_payloads: dict[bytes, memoryview] = {}
        self._open_keys: list[bytes] = []
        self._clock = 0
        self._fds: dict[int, int] = {}  # open segment files, for reads
        self.stats = DiskStats()
        self._rebuild()

    # ---- reads and writes ----------------------------------------------------------------

    def put(self, key: bytes, payload: bytes | memoryview) -> None:
        """Store ``payload`` under ``key`` (a stored key is only marked used)."""
        if len(key) != KEY_BYTES:
            raise ValueError(f"keys are {KEY_BYTES} bytes, got {len(key)}")
        with self._lock:
            if key in self._index:
                self._touch(self._index[key])
                return
            digest = checksum(payload)
            self._open += [_HEADER.pack(MAGIC, key, len(payload), digest), payload]
            self._index[key] = _Record(-1, self._open_bytes + _HEADER.size, len(payload), digest)
            self._open_bytes += _HEADER.size + len(payload)
            self._open_payloads[key] = payload
            self._open_keys.append(key)
            self.stats.pages += 1
            self.stats.bytes_used += _HEADER.size + len(payload)
            if self._open_bytes >= self.segment_bytes:
                self._seal()

    def get_into(self, key: bytes, out: memoryview) -> bool:
        """Read the payload into ``out`` (a buffer of its size), checked: False when absent,
        or when corrupted or of another size (then dropped)."""
        with self._lock:
            record = self._index.get(key)
            if record is None:
                return False
            ok = record.length == len(out)
            if ok and record.segment < 0:
                out[:] = self._open_payloads[key]
            elif ok:
                ok = self._read_into(record, out)
            if not ok or checksum(out) != record.digest:
                self._drop(key)
                self.stats.corrupted_pages += 1
                return False
            self._touch(record)
            self.stats.bytes_read += len(out)
            return True

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    def stored_prefix(self, keys: list[bytes]) -> int:
        """How many of ``keys``, from the first, are stored."""
        n = 0
        while n < len(keys) and keys[n] in self._index:
            n += 1
        return n

    def flush(self) -> None:
        """Seal the open segment: what is stored so far survives a restart."""
        with self._lock:
            self._seal()

    # ---- segments ------------------------------------------------------------------------

    def _seal(self) -> None:
        if not self._open:
            return
        size = self._open_bytes
        n = max(self._segments, default=0) + 1
        path = self._path(n)
        tmp = path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, self._open)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:  # a full or vanished disk: the open segment's pages are lost
            tmp.unlink(missing_ok=True)
            for key in self._open_keys:
                del self._index[key]
            self.stats.pages -= len(self._open_keys)
            self.stats.bytes_used -= size
            self._clear_open()
            raise
        for key in self._open_keys:
            self._index[key].segment = n
        self._segments[n] = {
            "bytes": size,
            "keys": self._open_keys,
            "used": self._tick(),
        }
        self.stats.bytes_written += size
        self._clear_open()
        self._evict_to_capacity()

    def _clear_open(self) -> None:
        self._open, self._open_bytes = [], 0
        self._open_payloads, self._open_keys = {}, []

    def _evict_to_capacity(self) -> None:
        while self.stats.bytes_used > self.capacity_bytes and self._segments:
            n = min(self._segments, key=lambda s: self._segments[s]["used"])
            segment = self._segments.pop(n)
            if n in self._fds:
                os.close(self._fds.pop(n))
            self._path(n).unlink(missing_ok=True)
            for key in segment["keys"]:
                if self._index.get(key) is not None and self._index[key].segment == n:
                    del self._index[key]
                    self.stats.pages -= 1
                    self.stats.evicted_pages += 1
            self.stats.bytes_used -= segment["bytes"]

    def _read_into(self, record: _Record, out: memoryview) -> bool:
        try:
            fd = self._fds.get(record.segment)
            if fd is None:
                fd = self._fds[record.segment] = os.open(self._path(record.segment), os.O_RDONLY)
            return os.preadv(fd, [out], record.offset) == record.length
        except OSError:
            return False

    def close(self) -> None:
        """Seal what is open and close the files."""
        with self._lock:
            try:
                self._seal()
            finally:
                for fd in self._fds.values():
                    os.close(fd)
                self._fds.clear()

    def _drop(self, key: bytes) -> None:
        record = self._index.pop(key)
        self.stats.pages -= 1
        if record.segment >= 0:  # its bytes stay until the segment goes
            self._segments[record.segment]["keys"].remove(key)

    def _rebuild(self) -> None:
        """Index the sealed segments; leftovers of an interrupted seal are removed."""
        for tmp in self.root.glob("seg-*.tmp"):
            tmp.unlink()
        for path in sorted(self.root.glob("seg-*.bin")):
            n, keys, size = int(path.stem.split("-")[1]), [], path.stat().st_size
            with path.open("rb") as f:  # headers only: payloads are checked when read
                pos = 0
                while pos + _HEADER.size <= size:
                    magic, key, length, digest = _HEADER.unpack(f.read(_HEADER.size))
                    end = pos + _HEADER.size + length
                    if magic != MAGIC or end > size:
                        break  # a torn or garbled tail: keep what came before
                    if key not in self._index:
                        self._index[key] = _Record(n, pos + _HEADER.size, length, digest)
                        keys.append(key)
                    f.seek(end)
                    pos = end
            self._segments[n] = {"bytes": size, "keys": keys, "used": self._tick()}
            self.stats.pages += len(keys)
            self.stats.bytes_used += size
        self._evict_to_capacity()

    def _path(self, n: int) -> Path:
        return self.root / f"seg-{n:08d}.bin"

    def _touch(self, record: _Record) -> None:
        if record.segment >= 0:
            self._segments[record.segment]["used"] = self._tick()

    def _tick(self) -> int:
        self._clock += 1
        return self._clock
