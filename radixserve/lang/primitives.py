"""The pieces a program adds to its state: text, ``gen``, ``select`` and roles. They are
plain descriptions; the state's executor runs them against a backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixserve.engine import SamplingParams

# Sampling fields a gen may set; unset ones fall back to the run's defaults, then to
# SamplingParams' own.
GEN_FIELDS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "stop",
        "ignore_eos",
        "seed",
        "regex",
        "json_schema",
        "choice",
    }
)


@dataclass(frozen=True)
class Gen:
    name: str | None
    overrides: dict[str, Any] = field(default_factory=dict)

    def params(self, defaults: dict[str, Any]) -> SamplingParams:
        unknown = set(defaults) - GEN_FIELDS
        if unknown:
            raise ValueError(f"unknown sampling defaults {sorted(unknown)}")
        return SamplingParams(**{**defaults, **self.overrides})


@dataclass(frozen=True)
class Select:
    name: str | None
    choices: tuple[str, ...]


@dataclass(frozen=True)
class Role:
    role: str
    content: tuple[Any, ...]  # strings and primitives, run in order inside the role


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    stop: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    repetition_penalty: float | None = None,
    ignore_eos: bool | None = None,
    seed: int | None = None,
    regex: str | None = None,
    json_schema: dict | str | None = None,
    choices: list[str] | tuple[str, ...] | None = None,
) -> Gen:
    """Generate text at this point of the program; ``s[name]`` reads it back. ``regex``,
    ``json_schema`` or ``choices`` constrain what is generated (``select`` instead scores
    each choice by its likelihood)."""
    given = {
        "max_new_tokens": max_tokens,
        "stop": stop,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "repetition_penalty": repetition_penalty,
        "ignore_eos": ignore_eos,
        "seed": seed,
        "regex": regex,
        "json_schema": json_schema,
        "choice": None if choices is None else tuple(choices),
    }
    overrides = {k: v for k, v in given.items() if v is not None}
    SamplingParams(**overrides)  # bad values fail here, where they are written
    return Gen(name, overrides)


def select(name: str | None = None, choices: list[str] | tuple[str, ...] = ()) -> Select:
    """Pick the choice with the highest mean token log-probability after the context."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("select needs a non-empty list of non-empty strings")
    return Select(name, tuple(choices))


def _role(role: str, content: Any) -> Role:
    parts = content if isinstance(content, list | tuple) else (content,)
    for part in parts:
        if not isinstance(part, str | Gen | Select):
            raise TypeError(f"a {role} message holds strings, gen and select, not {type(part)}")
    return Role(role, tuple(parts))


def system(content: Any = "") -> Role:
    return _role("system", content)


def user(content: Any = "") -> Role:
    return _role("user", content)


def assistant(content: Any = "") -> Role:
    return _role("assistant", content)
