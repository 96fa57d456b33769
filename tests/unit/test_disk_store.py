"""The disk tier's store: pages survive a restart once sealed, a flipped byte is caught and
dropped, the folder stays within its bound (least recently used segments go first), other
models' folders are never read, and files are the owner's only."""

import stat
import threading

import pytest

from radixserve.memory.tiers.disk_store import DiskStore

PAGE = 1000


def key(i: int) -> bytes:
    return i.to_bytes(16, "little")


def payload(i: int) -> bytes:
    return bytes([i % 251]) * PAGE


def read(store: DiskStore, k: bytes) -> bytes | None:
    """The page under ``k`` (all are ``PAGE`` bytes), or None."""
    out = bytearray(PAGE)
    return bytes(out) if store.get_into(k, memoryview(out)) else None


def open_store(path, capacity=10**6, segment=4 * PAGE, fingerprint="m1"):
    return DiskStore(path, fingerprint, capacity, segment)


def sealed(path, pages: int = 4):
    """A store holding ``pages`` pages in one sealed segment, and that segment's file."""
    store = open_store(path)
    for i in range(pages):
        store.put(key(i), payload(i))
    store.flush()
    (segment,) = store.root.glob("seg-*.bin")
    return store, segment


def test_pages_round_trip_and_survive_a_restart_once_sealed(tmp_path):
    store = open_store(tmp_path)
    for i in range(10):
        store.put(key(i), payload(i))
    assert all(read(store, key(i)) == payload(i) for i in range(10))  # open segment included
    store.flush()
    again = open_store(tmp_path)
    assert again.stats.pages == 10
    assert all(read(again, key(i)) == payload(i) for i in range(10))
    assert again.stored_prefix([key(0), key(1), key(99), key(2)]) == 2


def test_unsealed_pages_are_lost_in_a_crash_but_nothing_half_written_appears(tmp_path):
    store = open_store(tmp_path, segment=10 * PAGE)
    for i in range(3):  # below a segment: never sealed
        store.put(key(i), payload(i))
    (store.root / "seg-00000009.tmp").write_bytes(b"half a segment")  # an interrupted seal
    again = open_store(tmp_path)
    assert again.stats.pages == 0 and read(again, key(0)) is None
    assert not list(again.root.glob("*.tmp"))


def test_a_flipped_byte_is_caught_dropped_and_counted(tmp_path):
    _, segment = sealed(tmp_path)
    data = bytearray(segment.read_bytes())
    data[2 * (32 + PAGE) + 32 + PAGE // 2] ^= 0xFF  # inside the third page's payload
    segment.write_bytes(bytes(data))
    again = open_store(tmp_path)
    got = [read(again, key(i)) for i in range(4)]
    assert sum(g is None for g in got) == 1 and again.stats.corrupted_pages == 1
    assert all(g == payload(i) for i, g in enumerate(got) if g is not None)
    assert again.stats.pages == 3


def test_a_torn_segment_keeps_the_records_before_the_tear(tmp_path):
    _, segment = sealed(tmp_path)
    segment.write_bytes(segment.read_bytes()[: -PAGE // 2])
    again = open_store(tmp_path)
    assert [read(again, key(i)) is not None for i in range(4)] == [True, True, True, False]


def test_the_folder_stays_within_its_bound_and_recently_read_segments_stay(tmp_path):
    store = open_store(tmp_path, capacity=12 * PAGE, segment=4 * PAGE)
    for i in range(8):  # two segments
        store.put(key(i), payload(i))
    assert read(store, key(0)) == payload(0)  # the first segment is now the recent one
    for i in range(8, 12):  # a third segment: over the bound by one
        store.put(key(i), payload(i))
    sizes = sum(p.stat().st_size for p in store.root.glob("seg-*.bin"))
    assert sizes == store.stats.bytes_used <= 12 * PAGE + 4 * 64
    assert read(store, key(0)) == payload(0)  # kept: used recently
    assert read(store, key(4)) is None  # the second segment went
    assert store.stats.evicted_pages == 4


def test_another_models_folder_gives_no_hits(tmp_path):
    store = open_store(tmp_path, fingerprint="model-a")
    store.put(key(1), payload(1))
    store.flush()
    other = open_store(tmp_path, fingerprint="model-b")
    assert read(other, key(1)) is None and other.stats.pages == 0


def test_files_are_the_owners_only(tmp_path):
    store = open_store(tmp_path)
    store.put(key(1), payload(1))
    store.flush()
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700
    for path in store.root.glob("seg-*"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def test_a_folder_that_cannot_be_written_fails_at_open(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr("pathlib.Path.touch", refuse)
    with pytest.raises(OSError):
        open_store(tmp_path)


def test_writers_and_readers_on_threads(tmp_path):
    store = open_store(tmp_path, capacity=10**7)

    def write(base):
        for i in range(base, base + 50):
            store.put(key(i), payload(i))

    threads = [threading.Thread(target=write, args=(b,)) for b in (0, 1000, 2000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.flush()
    assert store.stats.pages == 150
    pages = [b + i for b in (0, 1000, 2000) for i in range(50)]
    assert all(read(store, key(i)) == payload(i) for i in pages)
