"""The frontend language: programs of ``gen``, ``select``, roles and ``fork`` whose calls
extend one another's token ids, so their shared prefixes are computed once."""

from radixserve.engine import ChatFormat
from radixserve.lang.backend import BaseBackend, EngineBackend
from radixserve.lang.function import Program, function, set_default_backend
from radixserve.lang.primitives import assistant, gen, select, system, user
from radixserve.lang.runtime_endpoint import RuntimeEndpoint
from radixserve.lang.state import ProgramError, ProgramState

__all__ = [
    "BaseBackend",
    "ChatFormat",
    "EngineBackend",
    "Program",
    "ProgramError",
    "ProgramState",
    "RuntimeEndpoint",
    "assistant",
    "function",
    "gen",
    "select",
    "set_default_backend",
    "system",
    "user",
]
