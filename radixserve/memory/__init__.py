"""KV memory bookkeeping: slot allocation and per-request slot tables."""

from radixserve.memory.allocator import KVSlotAllocator, OutOfSlots
from radixserve.memory.req_to_token import OutOfRows, ReqToTokenTable

__all__ = ["KVSlotAllocator", "OutOfRows", "OutOfSlots", "ReqToTokenTable"]
