"""KV memory: page-aligned slot allocation and the per-layer K/V tensors."""

from radixserve.memory.allocator import KVSlotAllocator, OutOfSlots

__all__ = ["KVSlotAllocator", "OutOfSlots"]
