"""The grammar fields of SamplingParams: at most one, checked when built, normalised to the
text the compiler is keyed by."""

import json

import pytest

from radixserve.engine import SamplingParams


def test_a_schema_dict_becomes_its_json_text_in_key_order():
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    p = SamplingParams(json_schema=schema)
    assert p.grammar == ("json_schema", json.dumps(schema))
    assert list(json.loads(p.json_schema)["properties"]) == ["b", "a"]


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        ({"regex": "[a-z]+"}, "regex"),
        ({"ebnf": 'root ::= "x"'}, "ebnf"),
        ({"choice": ["a", "b"]}, "choice"),
        ({"json_object": True}, "json_object"),
        ({}, None),
    ],
)
def test_each_grammar_field_names_its_kind(fields, kind):
    grammar = SamplingParams(**fields).grammar
    assert (grammar and grammar[0]) == kind


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"regex": "a", "choice": ["a"]}, "at most one of regex, choice"),
        ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
        ({"json_schema": 3}, "json_schema must be a dict"),
        ({"regex": ""}, "regex must be a non-empty string"),
        ({"choice": []}, "choice must be a non-empty list"),
        ({"choice": ["a", ""]}, "choice must be a non-empty list"),
    ],
)
def test_bad_grammar_fields_fail_when_built(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def test_without_xgrammar_a_grammar_is_a_value_error_naming_the_extra(monkeypatch):
    import sys

    from radixserve.engine.structured.grammar import GrammarCompiler

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import fails
    compiler = GrammarCompiler(None, 16, [], timeout_s=1)
    with pytest.raises(ValueError, match=r"radixserve\[structured\]"):
        compiler.compile(SamplingParams(regex="a"))
    compiler.close()
