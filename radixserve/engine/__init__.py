"""The engine: requests, scheduling over the prefix cache, sampling, the embedded API."""

from radixserve.chat import ChatFormat
from radixserve.engine.config import EngineConfig
from radixserve.engine.sampling_params import SamplingParams


def __getattr__(name: str):
    # The Engine pulls in torch and the model; the scheduler and its bookkeeping do not.
    if name == "Engine":
        from radixserve.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixserve.engine' has no attribute {name!r}")


__all__ = ["ChatFormat", "Engine", "EngineConfig", "SamplingParams"]
