"""Structured output on the tiny preset: across seeds at temperature 1, every output follows
its grammar (``jsonschema`` for JSON, ``re.fullmatch`` for regexes), with jump-forward on and
off; bad grammars fail their request only; masks stay on their own rows."""

import asyncio
import json
import re

import jsonschema
import pytest

from radixserve import Engine
from radixserve.engine import SamplingParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"},
        "tier": {"enum": ["gold", "silver", "bronze"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "zip": {"type": "integer"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "member", "tier", "tags", "address"],
}
ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "price": {"type": "number", "minimum": 0, "maximum": 100},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]},
    },
    "required": ["id", "count", "price", "note"],
    "additionalProperties": False,
}
REGEXES = [
    r"\d{3}-\d{4}",
    r"(yes|no|maybe), because [a-z ]{1,20}\.",
    r"[A-Z][a-z]{2,8}@[a-z]{3}\.com",
]
CHOICES = ["red apple", "green pear", 'a "quoted" one', "line\nbreak"]
PROMPTS = ["Describe the record:", "Here is the next one.", "Output:"]
SEEDS = range(4)


@pytest.fixture(scope="module")
def engine():
    with Engine("tiny", page_size=4, check_invariants=True) as e:
        yield e


def sample(engine, n_tokens=160, **grammar) -> list[dict]:
    params = [
        SamplingParams(max_new_tokens=n_tokens, temperature=1.0, seed=seed, **grammar)
        for seed in SEEDS
        for _ in PROMPTS
    ]
    return engine.generate(PROMPTS * len(SEEDS), params)


@pytest.mark.parametrize("jump_forward", [True, False])
@pytest.mark.parametrize("schema", [PERSON, ORDER], ids=["person", "order"])
def test_every_output_validates_against_its_schema(engine, schema, jump_forward):
    for out in sample(engine, json_schema=schema, jump_forward=jump_forward):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out["text"]
        jsonschema.validate(json.loads(out["text"]), schema)


@pytest.mark.parametrize("jump_forward", [True, False])
def test_json_object_outputs_are_json_objects(engine, jump_forward):
    # unbounded JSON may run to max_tokens; every output that ended is an object
    outs = sample(engine, 96, json_object=True, jump_forward=jump_forward)
    ended = [o for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    assert ended
    for out in ended:
        assert isinstance(json.loads(out["text"]), dict)


@pytest.mark.parametrize("jump_forward", [True, False])
@pytest.mark.parametrize("regex", REGEXES)
def test_every_output_fullmatches_its_regex(engine, regex, jump_forward):
    for out in sample(engine, regex=regex, jump_forward=jump_forward):
        assert re.fullmatch(regex, out["text"]), out["text"]
        assert out["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize("jump_forward", [True, False])
def test_every_choice_is_one_of_the_choices(engine, jump_forward):
    outs = sample(engine, choice=CHOICES, jump_forward=jump_forward)
    assert {o["text"] for o in outs} <= set(CHOICES)
    assert len({o["text"] for o in outs}) > 1  # the seeds do not all pick one


def test_an_ebnf_grammar_constrains_the_output(engine):
    ebnf = 'root ::= "(" num (" + " num)* ")"\nnum ::= [1-9] [0-9]?'
    for out in sample(engine, ebnf=ebnf):
        assert re.fullmatch(r"\([1-9][0-9]?( \+ [1-9][0-9]?)*\)", out["text"]), out["text"]


def test_jump_forward_cuts_decode_steps_on_fixed_keys(engine):
    schema = {
        "type": "object",
        "properties": {k: {"type": "integer", "minimum": 0, "maximum": 9} for k in "abcdef"},
        "required": list("abcdef"),
    }
    steps, texts = {}, {}
    for jump in (False, True):
        before = engine.cache_stats()["scheduler_steps"]
        params = SamplingParams(max_new_tokens=80, json_schema=schema, jump_forward=jump)
        out = engine.generate("Scores:", params)
        steps[jump] = engine.cache_stats()["scheduler_steps"] - before
        texts[jump] = json.loads(out["text"])
        assert set(texts[jump]) == set("abcdef")
    assert steps[True] <= 0.7 * steps[False], steps


def test_constrained_rows_leave_their_neighbours_alone(engine):
    free = SamplingParams(max_new_tokens=12, temperature=0)
    alone = engine.generate(PROMPTS, free)
    constrained = SamplingParams(max_new_tokens=12, temperature=0, regex=r"[0-9]{12}")
    mixed = engine.generate(PROMPTS + PROMPTS, [free] * 3 + [constrained] * 3)
    assert [o["token_ids"] for o in mixed[:3]] == [o["token_ids"] for o in alone]
    assert all(re.fullmatch(r"[0-9]{12}", o["text"]) for o in mixed[3:])


def test_samples_of_one_constrained_prompt_share_its_prefix(engine):
    prompt = "A long shared instruction about the format of the answer. " * 4
    params = SamplingParams(max_new_tokens=160, temperature=1.0, n=4, json_schema=ORDER)
    outs = engine.generate(prompt, params)
    assert max(o["meta_info"]["cached_tokens"] for o in outs) > 0
    for out in outs:
        jsonschema.validate(json.loads(out["text"]), ORDER)


@pytest.mark.parametrize(
    ("grammar", "reason"),
    [
        ({"regex": "a(b"}, "regex does not compile: .*parenthesis"),
        ({"json_schema": {"type": "nope"}}, "json_schema does not compile: .*nope"),
        ({"ebnf": "root ::= "}, "ebnf does not compile"),
    ],
)
def test_a_grammar_that_does_not_compile_fails_only_its_request(engine, grammar, reason):
    with pytest.raises(ValueError, match=reason):
        engine.generate("x", SamplingParams(max_new_tokens=4, **grammar))
    with pytest.raises(ValueError, match=reason):
        asyncio.run(engine.async_generate("x", SamplingParams(max_new_tokens=4, **grammar)))
    assert engine.generate("still serving", SamplingParams(max_new_tokens=3))["token_ids"]


def test_a_stream_reports_a_bad_grammar_and_streams_a_good_one(engine):
    async def collect(params):
        return [c async for c in engine.generate_stream("Stream:", params)]

    with pytest.raises(ValueError, match="does not compile"):
        asyncio.run(collect(SamplingParams(regex="[z-a]")))
    with pytest.raises(ValueError, match="does not compile"):
        asyncio.run(engine.check_grammar(SamplingParams(regex="[z-a]")))
    chunks = asyncio.run(collect(SamplingParams(max_new_tokens=80, json_schema=ORDER, seed=5)))
    jsonschema.validate(json.loads("".join(c["text"] for c in chunks)), ORDER)


def test_a_slow_compile_times_out_with_a_reason():
    with Engine("tiny", grammar_compile_timeout_s=1e-6) as e:
        with pytest.raises(ValueError, match="did not compile within"):
            e.generate("x", SamplingParams(json_schema=PERSON))
        assert e.generate("x", SamplingParams(max_new_tokens=2))["token_ids"]


def test_masks_are_counted(engine):
    sample(engine, 40, regex=r"[a-z]{5}")
    stats = engine.cache_stats()
    assert stats["grammar_fill_s"] > 0 and stats["grammar_wait_s"] > 0


def test_constrained_requests_survive_preemption():
    # a pool this small preempts; a resumed request's matcher still matches its output.
    # The token budget alone (no ITL model, which sizes chunks by measured step times)
    # makes the schedule, and so the preemptions, the same run after run.
    options = dict(page_size=4, max_total_tokens=160, itl_ratio=None, check_invariants=True)
    with Engine("tiny", **options) as e:
        params = [
            SamplingParams(max_new_tokens=60, temperature=1.0, seed=s, json_schema=ORDER)
            for s in range(8)
        ]
        outs = e.generate(["A longer prompt to take some room in the pool: go."] * 8, params)
        assert e.cache_stats()["preemptions"] > 0
    stopped = [o for o in outs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    assert len(stopped) >= len(outs) // 2
    for out in stopped:
        jsonschema.validate(json.loads(out["text"]), ORDER)


@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 8}, {"type": "string"}])
def test_json_strings_take_characters_not_encoded_surrogates(schema):
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from radixserve.engine.structured.grammar import GrammarCompiler
    from radixserve.model.presets import preset_tokenizer

    tokenizer = preset_tokenizer("tiny")
    stop = [tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    grammars = GrammarCompiler(tokenizer, len(tokenizer), stop, timeout_s=60)
    params = SamplingParams(json_schema=schema)
    byte = {b: tokenizer.convert_tokens_to_ids(c) for b, c in bytes_to_unicode().items()}
    try:
        # ED 9F BF is U+D7FF, a character; ED B5 83 would be U+DD43, a surrogate
        for tail, accepted in (([0x9F, 0xBF, 0x22], True), ([0xB5], False)):
            matcher = grammars._matcher(grammars.result(params))
            assert all(matcher.accept_token(byte[b]) for b in [0x22, 0xED])
            assert all(matcher.accept_token(byte[b]) for b in tail) == accepted
    finally:
        grammars.close()
