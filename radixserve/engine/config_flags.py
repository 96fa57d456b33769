"""``EngineConfig``'s fields as ``radixserve serve`` flags and as docs/engine.md's options
table, both made from the dataclass: a field's ``metadata["help"]`` is its flag's help and
its row's meaning, its annotation the flag's type, its default the flag's default.

A flag is the field's name with ``-`` (``--page-size``). An int, float or str field takes
its value as it is; ``X | None`` also takes ``none`` for None; a bool field that defaults to
True is ``--x``/``--no-x``, one that defaults to False ``--x``; a tuple or list field takes a
comma list (``a,b,c``), a dict field (or any other type) JSON; ``Any`` is taken as a str
(``cpu_profile``: a file's path). ``ALIASES`` keeps the spellings ``serve`` had before.

Nothing here imports torch: ``radixserve --help`` does not load it. The docs table::

    python -m radixserve.engine.config_flags --write-docs docs/engine.md
    python -m radixserve.engine.config_flags --check-docs docs/engine.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from radixserve.engine.config import EngineConfig

# older spellings of a field's flag, each with its argparse action
ALIASES: dict[str, tuple[tuple[str, str], ...]] = {
    "enable_prefix_cache": (("--disable-prefix-cache", "store_false"),),
}
# a value a field's flag also takes for None: `--itl-ratio 0` was "no such cap"
NONE_VALUES: dict[str, object] = {"itl_ratio": 0.0}
BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"
DOCS_TITLE = "# The engine and its options"
DOCS_SENTENCE = (
    "`Engine(model, **options)` and `radixserve serve --model MODEL [flags]` take the same "
    "options, the fields of the frozen dataclass `EngineConfig`:"
)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_and_optional(annotation: Any) -> tuple[Any, bool]:
    """``int | None`` -> (int, True)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _bool(text: str) -> bool:
    words = {"true": True, "1": True, "yes": True, "on": True}
    words |= {"false": False, "0": False, "no": False, "off": False}
    if text.lower() not in words:
        raise ValueError(text)
    return words[text.lower()]


def _converter(annotation: Any) -> Callable[[str], Any]:
    """From a flag's text to the value of a field of this (non-optional) type."""
    if annotation is Any or annotation is str:
        return str
    if annotation is bool:
        return _bool
    if annotation in (int, float):
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (tuple, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            items = [_converter(a) for a in args]
        else:
            items = [_converter(args[0] if args else str)]

        def comma_list(text: str) -> Any:
            parts = [p.strip() for p in text.split(",") if p.strip()]
            if len(items) > 1 and len(parts) != len(items):
                raise ValueError(text)
            return origin(items[min(i, len(items) - 1)](p) for i, p in enumerate(parts))

        comma_list.__name__ = "comma list"
        return comma_list
    return json.loads  # a dict, or anything else: JSON


def _parse(f: dataclasses.Field, annotation: Any) -> Callable[[str], Any]:
    base, optional = _base_and_optional(annotation)
    optional = optional or base is Any
    convert = _converter(base)
    none = NONE_VALUES.get(f.name, dataclasses.MISSING)

    def parse(text: str) -> Any:
        if optional and text.strip().lower() == "none":
            return None
        value = convert(text)
        return None if optional and value == none else value

    parse.__name__ = getattr(base, "__name__", "value")  # argparse: "invalid int value: 'x'"
    return parse


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"{f.name} has no default: a flag would need one")


def _fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls) if f.init]


def _help(f: dataclasses.Field) -> str:
    text = f.metadata.get("help")
    if not text:
        raise ValueError(f"{f.name} has no metadata help: write one for its flag and docs row")
    return text


def flags_of(cls: type = EngineConfig) -> dict[str, list[str]]:
    """Each field's flags, its aliases included."""
    out = {}
    for f, annotation in _fields(cls):
        names = [flag(f.name)]
        if annotation is bool and _default(f) is True:
            names.append("--no-" + f.name.replace("_", "-"))
        out[f.name] = names + [alias for alias, _ in ALIASES.get(f.name, ())]
    return out


def add_config_arguments(parser: argparse.ArgumentParser, cls: type = EngineConfig) -> None:
    """A flag for every field of ``cls``, into an argument group of ``parser``."""
    group = parser.add_argument_group(
        "engine options", f"the fields of {cls.__name__}, documented in docs/engine.md"
    )
    for f, annotation in _fields(cls):
        default, help = _default(f), _help(f).replace("%", "%%")
        if annotation is bool:
            action = argparse.BooleanOptionalAction if default else "store_true"
            group.add_argument(flag(f.name), action=action, default=default, help=help)
        else:
            group.add_argument(
                flag(f.name),
                type=_parse(f, annotation),
                default=default,
                metavar=f.metadata.get("metavar"),
                help=help,
            )
        for alias, action in ALIASES.get(f.name, ()):
            same = flag(f.name) if action == "store_true" else "--no-" + flag(f.name)[2:]
            group.add_argument(
                alias, dest=f.name, action=action, default=argparse.SUPPRESS, help=f"as {same}"
            )


def config_options(args: argparse.Namespace, cls: type = EngineConfig) -> dict[str, Any]:
    """Every field's parsed value, by name."""
    return {f.name: getattr(args, f.name) for f, _ in _fields(cls)}


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """``Engine(args.model, **engine_options(args))``: every field but the model."""
    options = config_options(args)
    del options["model"]
    return options


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The (validated) config the parsed flags give."""
    return EngineConfig(**config_options(args))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def options_table(cls: type = EngineConfig) -> str:
    """The markdown table of the fields: option | flag | default | meaning."""
    flags = flags_of(cls)
    rows = ["| option | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for f, _ in _fields(cls):
        names = ", ".join(f"`{n}`" for n in flags[f.name])
        default = f"`{_default(f)!r}`"
        rows.append(f"| `{f.name}` | {_cell(names)} | {_cell(default)} | {_cell(_help(f))} |")
    return "\n".join(rows) + "\n"


def render_docs(text: str | None, cls: type = EngineConfig) -> str:
    """``text`` (a page, or None for a new one) with its markers' table made anew."""
    block = f"{BEGIN}\n{options_table(cls)}{END}"
    if text is None:
        return f"{DOCS_TITLE}\n\n{DOCS_SENTENCE}\n\n{block}\n"
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"the page needs one {BEGIN} and, after it, one {END}")
    head, rest = text.split(BEGIN)
    return head + block + rest.split(END, 1)[1]


def write_docs(path: str | Path) -> bool:
    """Writes the table into the page at ``path`` (made if missing); whether it changed."""
    path = Path(path)
    old = path.read_text() if path.exists() else None
    new = render_docs(old)
    if new != old:
        path.write_text(new)
    return new != old


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="docs/engine.md's table of EngineConfig")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--write-docs", metavar="PAGE", help="write the table into PAGE")
    how.add_argument("--check-docs", metavar="PAGE", help="fail if PAGE's table is stale")
    args = parser.parse_args(argv)
    if args.write_docs:
        print(f"{args.write_docs}: {'written' if write_docs(args.write_docs) else 'as it was'}")
        return 0
    page = Path(args.check_docs)
    if page.exists() and render_docs(page.read_text()) == page.read_text():
        return 0
    print(f"{page}: stale; run python -m radixserve.engine.config_flags --write-docs {page}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
