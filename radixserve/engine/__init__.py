"""The engine: requests, scheduling over the prefix cache, sampling, the embedded API."""

from radixserve.engine.chat_format import ChatFormat
from radixserve.engine.config import EngineConfig
from radixserve.engine.engine import Engine
from radixserve.engine.sampling_params import SamplingParams

__all__ = ["ChatFormat", "Engine", "EngineConfig", "SamplingParams"]
