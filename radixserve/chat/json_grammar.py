"""JSON schemas as xgrammar EBNF, shared by structured output and by the tool-call
parsers that constrain a call's arguments; xgrammar is imported on first use."""

from __future__ import annotations

import re

# xgrammar's messages open with a time and a source location
_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
# xgrammar (to 0.2.9 at least, xgrammar#800) writes a string with minLength/maxLength as a
# repetition of this class, which admits raw control characters that JSON forbids; they
# are taken out (escapes stay unavailable in such strings, which costs nothing valid).
# Both string classes also admit surrogates (U+D800-DFFF), which are no characters: their
# 3-byte forms (ED A0-BF ..) decode to three replacement characters, so a sampled string
# broke its maxLength; they are taken out of every JSON string.
_BOUNDED_STRING_CHAR = r"[^\"\\\r\n]"
_UNBOUNDED_STRING_CHAR = r"[^\0-\x1f\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\\uD800-\uDFFF]"


def xgrammar_module():
    try:
        import xgrammar
    except ImportError:
        raise ValueError(
            "structured output needs xgrammar: pip install 'radixserve[structured]'"
        ) from None
    return xgrammar


def compiler_message(exc: Exception) -> str:
    return _LOCATION.sub("", str(exc).strip())


def json_schema_ebnf(schema: str) -> str:
    """An EBNF grammar (root rule ``root``) of compact JSON (no whitespace beyond the
    separators ", " and ": ", so a model cannot loop on spaces) valid against ``schema``."""
    xgr = xgrammar_module()
    try:
        ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    except Exception as exc:  # the converter's own message names what is wrong
        raise ValueError(f"the JSON schema does not compile: {compiler_message(exc)}") from None
    for loose in (_BOUNDED_STRING_CHAR, _UNBOUNDED_STRING_CHAR):
        ebnf = ebnf.replace(loose, _JSON_STRING_CHAR)
    return ebnf
