"""The frontend language on the tiny preset, in process and over HTTP: roles render as the
chat template does, calls extend cached token ids, select scores like separate requests,
forks share their prefix, streaming adds up, errors surface without hanging a batch."""

import asyncio
import itertools

import pytest

import radixserve as rs
from radixserve.bench.http_load import ServerProcess
from radixserve.lang import EngineBackend, ProgramError
from radixserve.lang.backend import as_backend

SYSTEM = "You are a careful assistant who answers every question in a few short words. " * 3


@pytest.fixture(scope="module")
def engine():
    with rs.Engine("tiny", page_size=1, check_invariants=True) as eng:
        yield eng


@pytest.fixture(scope="module")
def endpoint():
    with ServerProcess(["--model", "tiny", "--page-size", "1"]) as server:
        backend = rs.RuntimeEndpoint(server.url)
        yield backend
        assert backend._call("GET", "/check_invariants") == {"ok": True}
        backend.close()


@pytest.fixture(params=["engine", "http"])
def backend(request):
    return request.getfixturevalue("engine" if request.param == "engine" else "endpoint")


@rs.function
def chat(s, questions):
    s += rs.system(SYSTEM)
    for i, q in enumerate(questions):
        s += rs.user(q)
        s += rs.assistant(rs.gen(f"a{i}", max_tokens=6))


def test_roles_render_exactly_as_the_chat_template(backend, engine):
    state = chat.run(questions=["first?", "second?"], backend=backend, temperature=0)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == state["a0"] and messages[4]["content"] == state["a1"]
    rendered = engine.tokenizer.apply_chat_template(messages, tokenize=False)
    assert state.text() == rendered


def test_role_blocks_equal_role_primitives(engine):
    @rs.function
    def blocks(s):
        with s.system():
            s += "Be brief. "
            s += "Be kind."
        with s.user():
            s += "Hi"

    @rs.function
    def primitives(s):
        s += rs.system(["Be brief. ", "Be kind."])
        s += rs.user("Hi")

    a, b = blocks.run(backend=engine), primitives.run(backend=engine)
    assert a.text() == b.text() and a.token_ids() == b.token_ids()
    assert a.messages()[0] == {"role": "system", "content": "Be brief. Be kind."}


def test_every_call_after_the_first_hits_the_programs_earlier_context(backend):
    state = chat.run(questions=["one?", "two?", "three?"], backend=backend, temperature=0)
    metas = [state.get_meta_info(f"a{i}") for i in range(3)]
    for prev, meta in itertools.pairwise(metas):
        # the earlier call's whole context, less its last generated token (never computed)
        earlier = prev["prompt_tokens"] + prev["completion_tokens"] - 1
        assert meta["cached_tokens"] >= earlier
        assert meta["prompt_tokens"] > earlier + 1


def test_the_same_program_gives_the_same_result_on_both_backends(engine, endpoint):
    qs = ["Where is Rome?", "And Paris?"]
    local = chat.run(questions=qs, backend=engine, temperature=0)
    remote = chat.run(questions=qs, backend=endpoint, temperature=0)
    assert local.text() == remote.text()
    assert local.token_ids() == remote.token_ids()


def test_select_picks_the_best_mean_logprob_computed_as_separate_requests(backend):
    choices = ["yes", "no", "maybe later today"]

    @rs.function
    def pick(s):
        s += rs.system(SYSTEM)
        s += rs.user("Is the sky blue?")
        with s.assistant():
            s += rs.select("answer", choices=choices)

    state = pick.run(backend=backend)
    meta = state.get_meta_info("answer")
    tokenize = as_backend(backend).tokenize
    context = state.token_ids()[: meta["prompt_tokens"][0] - len(tokenize(choices[0]))]
    with rs.Engine("tiny", enable_prefix_cache=False) as oracle:
        expected = []
        for c in choices:
            params = rs.SamplingParams(
                max_new_tokens=1, return_logprob=True, logprob_start_len=len(context)
            )
            out = oracle.generate(input_ids=context + tokenize(c), sampling_params=params)
            logps = [lp for lp, _ in out["meta_info"]["input_token_logprobs"]]
            expected.append(sum(logps) / len(logps))
    assert meta["normalized_logprobs"] == pytest.approx(expected, abs=1e-4)
    assert state["answer"] == choices[max(range(3), key=expected.__getitem__)]
    assert state.text().endswith(state["answer"] + "<|im_end|>\n")
    again = pick.run(backend=backend).get_meta_info("answer")
    assert again["normalized_logprobs"] == pytest.approx(expected, abs=1e-4)
    # each choice recomputes only the context's last token (its logits score the choice)
    assert min(again["cached_tokens"]) >= len(context) - 1


def test_fork_branches_share_the_prefix_and_leave_the_parent_alone(backend):
    @rs.function
    def branches(s):
        s += rs.system(SYSTEM)
        s += rs.user("Give me an idea for a garden party. " * 6)  # ~50 new tokens to share
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += rs.assistant(rs.gen("idea", max_tokens=5, temperature=0.9, seed=i))
        return forks

    state = branches.run(backend=backend)
    parent = state.text()
    forks = state.children
    assert len(forks) == 3
    for f in forks:
        assert f.text().startswith(parent) and f.text() != parent
        assert f.messages()[-1] == {"role": "assistant", "content": f["idea"]}
    fork_len = len(state.token_ids())
    cached = sorted(f.get_meta_info("idea")["cached_tokens"] for f in forks)
    assert cached[1] >= fork_len - 1  # computed once, by at most one branch
    with pytest.raises(ValueError):
        state.fork(0)


def test_branches_compute_their_common_header_once_and_sequential_use_does_not_wait(backend):
    @rs.function
    def short_fork(s, question):
        s += rs.system(SYSTEM)
        s += rs.user(question)  # a few new tokens, then each branch adds the same header
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += rs.assistant(rs.gen("idea", max_tokens=4, temperature=0.9, seed=i))
        a, b = s.fork(2)  # used one after the other: b only starts once a has finished
        a += rs.gen("x", max_tokens=2)
        a["x"]
        b += rs.gen("x", max_tokens=2)
        return forks

    state = short_fork.run(question="Name a colour.", backend=backend)
    for f in state.children[:3]:
        meta = f.get_meta_info("idea")
        assert meta["cached_tokens"] >= meta["prompt_tokens"] - 1
    assert all(c["x"] is not None for c in state.children[3:])


def test_streaming_yields_the_text_as_it_is_generated(backend):
    @rs.function
    def story(s):
        s += "Once upon a time"
        s += rs.gen("rest", max_tokens=24, ignore_eos=True, temperature=0)

    state = story.run(backend=backend, stream=True)
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text()
    assert len(pieces) > 5  # the generation arrived piece by piece, not at the end

    async def collect():
        s = story.run(backend=backend, stream=True)
        return [p async for p in s.text_async_iter()], s

    pieces, s = asyncio.run(collect())
    assert "".join(pieces) == s.text() == state.text()


def test_stop_strings_cut_the_text_and_the_ids_follow_it(engine):
    @rs.function
    def two_lines(s):
        s += "List:\n"
        s += rs.gen("line", max_tokens=30, stop=["e"], temperature=0)
        s += "!"

    state = two_lines.run(backend=engine)
    assert "e" not in state["line"]
    assert state.text() == "List:\n" + state["line"] + "!"
    be = EngineBackend(engine)
    expected = be.tokenize("List:\n") + be.tokenize(state["line"]) + be.tokenize("!")
    assert state.token_ids() == expected


def test_sampling_defaults_from_run_and_overrides_in_gen(engine):
    @rs.function
    def two(s, temperature_note):
        s += temperature_note
        s += rs.gen("a", max_tokens=3)
        s += rs.gen("b", max_tokens=5, ignore_eos=True)

    state = two.run(temperature_note="x", backend=engine, max_tokens=2, ignore_eos=True)
    assert state.get_meta_info("a")["completion_tokens"] == 3
    assert state.get_meta_info("b")["completion_tokens"] == 5


def test_errors_surface_on_run_and_on_the_failed_states_only(engine):
    @rs.function
    def answer(s, question):
        s += rs.user(question)
        s += rs.assistant(rs.gen("a", max_tokens=4, temperature=0))
        s += "after: " + s["a"]

    too_long = "word " * 5000  # past the tiny model's 4096-token window
    with pytest.raises(ValueError, match="serves at most"):
        answer.run(question=too_long, backend=engine)
    with pytest.raises(TypeError):
        answer.run(backend=engine)  # a missing argument
    with pytest.raises(TypeError, match="holds strings"):
        answer.run(question=42, backend=engine)

    batch = [{"question": "hi"}, {"question": too_long}, {"question": "bye"}]
    states = answer.run_batch(batch, backend=engine, num_threads=2, progress_bar=True)
    assert [s.error() is None for s in states] == [True, False, True]
    assert "serves at most" in str(states[1].error())
    assert states[0]["a"] is not None and states[2].text().startswith("<|im_start|>user\nbye")
    with pytest.raises(KeyError):
        states[0]["never_set"]
    with pytest.raises(ProgramError):
        states[1]["a"]  # reading a result of the failed program raises its failure
    engine.check_invariants()


def test_backend_failures_over_http_surface_too(endpoint):
    @rs.function
    def answer(s, question):
        s += question
        s += rs.gen("a", max_tokens=4)

    with pytest.raises(RuntimeError, match="400"):
        answer.run(question="word " * 5000, backend=endpoint)


def test_default_backend_and_bad_primitives(engine):
    @rs.function
    def hello(s):
        s += "Hello"
        s += rs.gen("x", max_tokens=2)

    rs.set_default_backend(engine)
    assert hello.run()["x"] is not None
    with pytest.raises(ValueError):
        rs.gen("x", temperature=-1)
    with pytest.raises(ValueError):
        rs.select("x", choices=[])
    with pytest.raises(TypeError):
        rs.user(3.5)


def test_gen_constrains_by_regex_schema_and_choices_and_later_calls_see_it(backend):
    import json
    import re

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
    }

    @rs.function
    def form(s):
        s += "Code: "
        s += rs.gen("code", max_tokens=12, regex=r"[A-Z]{2}\d{2}", temperature=1.0)
        s += "\nData: "
        s += rs.gen("data", max_tokens=40, json_schema=schema, temperature=1.0)
        s += "\nColour: "
        s += rs.gen("colour", max_tokens=8, choices=["red", "blue"])
        s += "\nWhy: "
        s += rs.select("why", choices=["because", "so"])

    for seed in range(3):
        state = form.run(backend=backend, seed=seed)
        assert re.fullmatch(r"[A-Z]{2}\d{2}", state["code"])
        assert 0 <= json.loads(state["data"])["n"] <= 99
        assert state["colour"] in ("red", "blue")
        assert state.text().endswith(f"Colour: {state['colour']}\nWhy: {state['why']}")


def test_gen_with_tools_forces_and_parses_calls_on_both_backends(backend):
    import json

    import jsonschema

    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
            },
        },
    }
    closed = {"type": "object", "properties": {}, "additionalProperties": False}
    clock = {"type": "function", "function": {"name": "get_time", "parameters": closed}}

    @rs.function
    def agent(s, choice):
        with s.system():
            s += "You help with errands.\n\n" + s.tool_instructions([weather, clock])
        s += rs.user("Weather in Oslo?")
        s += rs.assistant(rs.gen("call", max_tokens=120, tools=[weather, clock],
                                 tool_choice=choice, temperature=1.0))  # fmt: skip
        s += rs.user(s.tool_result("rain"))
        s += rs.assistant(rs.gen("answer", max_tokens=6))

    for seed, choice in [(0, "required"), (1, "get_time"), (2, "required")]:
        state = agent.run(backend=backend, seed=seed, choice=choice)
        calls = state.get_meta_info("call")["tool_calls"]
        assert calls and len(calls) <= 2, state["call"]
        for call in calls:
            tool = weather if call["name"] == "get_weather" else clock
            jsonschema.validate(json.loads(call["arguments"]), tool["function"]["parameters"])
        if choice == "get_time":
            assert [c["name"] for c in calls] == ["get_time"]
        assert "<tool_response>\nrain\n</tool_response>" in state.text()
    with pytest.raises(ValueError, match="tool_choice"):
        rs.gen("x", tools=[weather], tool_choice="get_time")
