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
    tools: tuple[dict, ...] = ()  # OpenAI function tools the text may call
    tool_choice: str = "auto"  # auto, required, or a tool's name (the last two forced)

    def params(self, defaults: dict[str, Any]) -> SamplingParams:
        unknown = set(defaults) - GEN_FIELDS
        if unknown:
            raise ValueError(f"unknown sampling defaults {sorted(unknown)}")
        return SamplingParams(**{**defaults, **self.overrides})

    @property
    def forced_tools(self) -> list[dict]:
        """The tools a forced choice may call (none where the choice is ``auto``)."""
        if self.tool_choice == "auto":
            return []
        if self.tool_choice == "required":
            return list(self.tools)
        return [t for t in self.tools if t["function"]["name"] == self.tool_choice]


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
    tools: list[dict] | None = None,
    tool_choice: str = "auto",
) -> Gen:
    """Generate text at this point of the program; ``s[name]`` reads it back. ``regex``,
    ``json_schema`` or ``choices`` constrain what is generated (``select`` instead scores
    each choice by its likelihood). With ``tools`` (OpenAI function tools; describe them
    with ``s.tool_instructions``), the calls the text makes are parsed into
    ``s.get_meta_info(name)["tool_calls"]``; ``tool_choice`` ``required`` or a tool's name
    forces calls by grammar."""
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
    result = Gen(name, overrides, tuple(tools or ()), tool_choice)
    names = [t.get("function", {}).get("name") for t in result.tools]
    if tool_choice not in ("auto", "required") and tool_choice not in names:
        raise ValueError(f"tool_choice {tool_choice!r} is not auto, required or a tool's name")
    if result.forced_tools and (regex or json_schema or choices):
        raise ValueError("a forced tool_choice cannot go with regex, json_schema or choices")
    return result


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
