"""radixserve: an LLM serving engine built around a radix-tree prefix cache."""

from radixserve.cache import NoPrefixCache, PrefixMatch, RadixCache
from radixserve.memory import KVSlotAllocator, OutOfSlots, ReqToTokenTable

__version__ = "0.1.0"

__all__ = [
    "KVSlotAllocator",
    "NoPrefixCache",
    "OutOfSlots",
    "PrefixMatch",
    "RadixCache",
    "ReqToTokenTable",
    "__version__",
]
