"""radixserve: an LLM serving engine built around a radix-tree prefix cache."""

from radixserve.cache import NoPrefixCache, PrefixMatch, RadixCache
from radixserve.memory import KVSlotAllocator, OutOfSlots


def __getattr__(name: str):
    # The engine pulls in torch and transformers; load it only when asked for.
    if name in ("Engine", "EngineConfig", "SamplingParams"):
        import radixserve.engine as engine

        return getattr(engine, name)
    if name in _LANG:
        import radixserve.lang as lang

        return getattr(lang, name)
    raise AttributeError(f"module 'radixserve' has no attribute {name!r}")


_LANG = (
    "ProgramError",
    "RuntimeEndpoint",
    "assistant",
    "function",
    "gen",
    "select",
    "set_default_backend",
    "system",
    "user",
)
__version__ = "0.1.0"

__all__ = [
    "Engine",
    "EngineConfig",
    "KVSlotAllocator",
    "NoPrefixCache",
    "OutOfSlots",
    "PrefixMatch",
    "RadixCache",
    "SamplingParams",
    "__version__",
    *_LANG,
]
