import numpy as np
import pytest

from radixserve.memory import KVSlotAllocator, OutOfSlots


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_alloc_hands_out_whole_pages(page_size):
    alloc = KVSlotAllocator(8 * page_size, page_size)
    slots = alloc.alloc(page_size + 1)
    assert slots.dtype == np.int64
    assert len(slots) == 2 * page_size
    pages = slots.reshape(-1, page_size)
    assert (pages[:, 0] % page_size == 0).all()
    assert (np.diff(pages, axis=1) == 1).all()
    assert alloc.num_used == 2 * page_size
    assert alloc.num_free == 6 * page_size
    assert alloc.capacity == 8 * page_size


def test_alloc_zero_and_negative():
    alloc = KVSlotAllocator(16, 4)
    assert alloc.alloc(0).size == 0
    with pytest.raises(ValueError):
        alloc.alloc(-1)


def test_out_of_slots_allocates_nothing():
    alloc = KVSlotAllocator(16, 4)
    alloc.alloc(9)
    with pytest.raises(OutOfSlots, match="only 4 of 16 are free"):
        alloc.alloc(5)
    assert alloc.num_free == 4
    assert len(alloc.alloc(4)) == 4


def test_free_returns_pages_and_they_are_reused():
    alloc = KVSlotAllocator(16, 4)
    a = alloc.alloc(8)
    alloc.free(a[:4])
    assert alloc.num_free == 12
    again = alloc.alloc(4)
    assert sorted(again) == sorted(a[:4])


def test_no_slot_is_handed_out_twice():
    alloc = KVSlotAllocator(64, 4)
    held = [alloc.alloc(n) for n in (3, 9, 16, 1)]
    everything = np.concatenate(held)
    assert np.unique(everything).size == everything.size
    assert alloc.num_used == everything.size


@pytest.mark.parametrize(
    "bad",
    [[100], [-1], [4], [0, 0]],
    ids=["out-of-range", "negative", "not-allocated", "twice"],
)
def test_bad_free_raises_and_changes_nothing(bad):
    alloc = KVSlotAllocator(16, 1)
    alloc.alloc(4)  # slots 0..3
    before = alloc.num_free
    with pytest.raises(ValueError):
        alloc.free(bad)
    assert alloc.num_free == before
    assert alloc.is_allocated([0, 1, 2, 3])


def test_double_free_raises():
    alloc = KVSlotAllocator(8, 2)
    slots = alloc.alloc(2)
    alloc.free(slots)
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free(slots)
    assert alloc.num_free == 8


def test_free_accepts_any_slot_of_a_page():
    alloc = KVSlotAllocator(8, 4)
    slots = alloc.alloc(3)
    alloc.free(slots[:3])  # the page's unused slot need not be listed
    assert alloc.num_free == 8


def test_bad_construction():
    with pytest.raises(ValueError):
        KVSlotAllocator(10, 4)
    with pytest.raises(ValueError):
        KVSlotAllocator(0, 1)
    with pytest.raises(ValueError):
        KVSlotAllocator(8, 0)


def test_reset_frees_everything():
    alloc = KVSlotAllocator(8, 2)
    alloc.alloc(7)
    alloc.reset()
    assert alloc.num_free == 8
