"""The tree with lower tiers under it (disk; host memory over disk; host memory alone),
driven by random serves, evictions (which demote), restarts and tiers too small to keep
everything, against a reference: every page read back holds exactly the K/V computed for
its prefix, whatever was evicted, pushed down, dropped or restarted."""

import hypothesis.strategies as st
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radixserve.cache import RadixCache
from radixserve.memory import KVSlotAllocator
from radixserve.memory.kv_pool import KVPool
from radixserve.memory.tiers.disk_store import DiskStore
from radixserve.memory.tiers.disk_tier import DiskTier
from radixserve.memory.tiers.host_tier import HostTier
from radixserve.memory.tiers.pages import page_bytes

PAGE, SLOTS, LAYERS = 2, 48, 2


def value(prefix: tuple) -> float:
    """The K computed at the last position of ``prefix`` (V is K + 0.5)."""
    return float(hash(prefix) % 10007)


class DiskTierMachine(RuleBasedStateMachine):
    @initialize(
        capacity_pages=st.sampled_from([4, 12, 64]),
        host_pages=st.sampled_from([0, 3, 10]),
        disk=st.booleans(),
    )
    def setup(self, capacity_pages, host_pages=0, disk=True):
        import tempfile

        self.folder = tempfile.mkdtemp()
        bytes_per_page = 2 * LAYERS * PAGE * 1 * 4 * 4 + 32
        self.capacity = capacity_pages * bytes_per_page
        self.host_pages = host_pages
        self.disk = disk or not host_pages  # some tier under the pool
        self.loaded_pages = 0
        self._start()

    def _start(self):
        """A new process: an empty pool, tree and host tier over the same folder."""
        self.pool = KVPool(LAYERS, SLOTS, PAGE, 1, 4)
        self.allocator = KVSlotAllocator(SLOTS, PAGE)
        self.cache = RadixCache(PAGE, self.allocator)
        self.tier = self.store = None
        if self.disk:
            store = DiskStore(self.folder, "m", self.capacity, segment_bytes=self.capacity // 4)
            self.tier, self.store = DiskTier(self.pool, store, "m"), store
        if self.host_pages:
            host_bytes = self.host_pages * page_bytes(self.pool)
            self.tier = HostTier(self.pool, host_bytes, "m", self.tier)
        self.cache.on_evict = self.tier.demote

    def teardown(self):
        self.tier.close()

    def _fill(self, tokens: list[int], start: int, slots: np.ndarray) -> None:
        for i, slot in zip(range(start, len(tokens)), slots, strict=False):
            v = value(tuple(tokens[: i + 1]))
            for layer in range(LAYERS):
                self.pool.k[layer][slot] = v
                self.pool.v[layer][slot] = v + 0.5

    def _check(self, tokens: list[int], slots: np.ndarray) -> None:
        for i, slot in enumerate(slots):
            v = value(tuple(tokens[: i + 1]))
            for layer in range(LAYERS):
                assert float(self.pool.k[layer][slot, 0, 0]) == v
                assert float(self.pool.v[layer][slot, 0, 0]) == v + 0.5

    @rule(tokens=st.lists(st.integers(0, 3), min_size=PAGE, max_size=20))
    def serve(self, tokens):
        tokens = tokens[: len(tokens) - len(tokens) % PAGE]
        seq = np.asarray(tokens, dtype=np.int32)
        hit = self.cache.match_prefix(seq)
        self.cache.lock(hit.node)
        slots = hit.slots
        keys = self.tier.keys(seq, None)[hit.length // PAGE :]
        pages = len(self.tier.where(keys))
        fresh_from = hit.length
        if pages and self.allocator.num_free >= pages * PAGE:
            rows = self.tier.read_async(keys[:pages]).result()
            if rows is not None:
                loaded = self.allocator.alloc(pages * PAGE)
                self.tier.install(loaded, rows)
                slots = np.concatenate([slots, loaded])
                fresh_from += pages * PAGE
                self.loaded_pages += pages
        missing = len(tokens) - fresh_from
        if missing > self.allocator.num_free:
            self.cache.evict(missing - self.allocator.num_free)
        if missing <= self.allocator.num_free:
            new = self.allocator.alloc(missing)
            self._fill(tokens, fresh_from, new)
            slots = np.concatenate([slots, new])
        self._check(tokens, slots)  # what came from the tree and the disk is right
        done = self.cache.insert(seq[: len(slots)], slots)
        self.allocator.free(slots[hit.length : max(hit.length, done.prefix_len)])
        self.cache.unlock(hit.node)
        self.tier.sync()

    @rule(n=st.integers(1, 24))
    def evict(self, n):
        self.cache.evict(n)
        self.tier.sync()

    @rule()
    def restart(self):
        self.tier.close()
        self._start()

    @invariant()
    def accounting_holds(self):
        if hasattr(self, "cache"):
            self.cache.check_invariants()
            if self.store is not None:
                assert self.store.stats.bytes_used <= self.capacity + self.capacity // 4
            if self.host_pages:
                assert self.tier.snapshot()["host_pages"] <= self.host_pages


DiskTierMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDiskTierMachine = DiskTierMachine.TestCase


def test_the_machine_reads_pages_back():
    """The random runs above do exercise load-back (a guard against a vacuous machine)."""
    machine = DiskTierMachine()
    machine.setup(capacity_pages=64)
    machine.serve(tokens=[1, 2, 3, 0, 1, 1, 2, 2])
    machine.evict(n=24)
    machine.restart()
    machine.serve(tokens=[1, 2, 3, 0, 1, 1, 2, 2, 3, 3])
    assert machine.loaded_pages == 4
    machine.teardown()


def test_pages_pushed_down_from_host_memory_come_back_from_disk():
    """Host memory of two pages over a disk: of four pages evicted at once the first two
    (the prefix others share) stay in host memory, the rest go down; then a second prompt's
    pages push those two down too; all come back, from both tiers, with their K/V."""
    machine = DiskTierMachine()
    machine.setup(capacity_pages=64, host_pages=2, disk=True)
    machine.serve(tokens=[1, 2, 3, 0, 1, 1, 2, 2])
    machine.evict(n=24)
    first = np.array([1, 2, 3, 0, 1, 1, 2, 2])
    assert machine.tier.where(machine.tier.keys(first, None)) == ["host", "host", "disk", "disk"]
    machine.serve(tokens=[3, 3, 3, 3])
    machine.evict(n=24)
    assert machine.tier.where(machine.tier.keys(first, None)) == ["disk"] * 4
    machine.serve(tokens=[1, 2, 3, 0, 1, 1, 2, 2, 3, 3])
    assert machine.loaded_pages == 4
    snap = machine.tier.snapshot()
    assert snap["host_pages_evicted"] == 2 and snap["host_pages_loaded"] == 0
    assert snap["disk_pages_loaded"] == 4
    machine.teardown()
