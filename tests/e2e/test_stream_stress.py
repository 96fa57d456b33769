"""Many streams at once on the real model, with logprobs, stop strings, n > 1, drafts and
aborts: every stream read to its end reassembles to the request's non-streamed output
(tokens, text, logprobs, finish reason, usage), an aborted one is a prefix of it, and the
engine serves the rest and leaves the cache's accounting whole."""

import asyncio

import pytest

from radixserve import Engine
from radixserve.engine import SamplingParams
from tests.real_model import REAL_MODEL, real_model_file

__all__ = ["real_model_file"]  # fixture

QUESTIONS = [
    "What is the capital of France?",
    "List three fruits, one per line.",
    "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
    "Name a colour of the sky.",
]
PARAMS = [
    SamplingParams(max_new_tokens=24, temperature=0, return_logprob=True, top_logprobs_num=2),
    SamplingParams(
        max_new_tokens=24, temperature=0, stop=[" classic example", "is:"], return_logprob=True
    ),
    SamplingParams(max_new_tokens=12, temperature=0, n=2, stop=[" the"]),
    SamplingParams(max_new_tokens=20, temperature=0, repetition_penalty=1.2, return_logprob=True),
]
ABORTED = {1, 6, 11}  # these streams are closed after their first chunk
USAGE = ("prompt_tokens", "completion_tokens", "finish_reason")


@pytest.fixture(scope="module")
def engine(real_model_file):
    with Engine(REAL_MODEL, speculative="ngram", page_size=16, check_invariants=True) as e:
        yield e


def reassemble(chunks: list[dict]) -> dict:
    """One request's chunks put back together as ``generate`` reports it."""
    out = {"text": "", "token_ids": [], "logprobs": [], "top": []}
    for chunk in chunks:
        out["text"] += chunk["text"]
        out["token_ids"] += chunk["token_ids"]
        out["logprobs"] += chunk.get("output_token_logprobs", [])
        out["top"] += chunk.get("output_top_logprobs", [])
    out["meta_info"] = chunks[-1].get("meta_info")
    return out


def assert_logprobs_close(got: list, want: list) -> None:
    assert [t for _, t in got] == [t for _, t in want]
    assert [v for v, _ in got] == pytest.approx([v for v, _ in want], abs=1e-3)


async def read(engine: Engine, i: int, prompt: str, params: SamplingParams) -> list[list[dict]]:
    """The chunks of each of a request's samples; an aborted stream stops after its first."""
    stream = engine.generate_stream(prompt, params)
    chunks: list[list[dict]] = [[] for _ in range(params.n)]
    async for chunk in stream:
        chunks[chunk["index"]].append(chunk)
        if i in ABORTED:
            await stream.aclose()
            break
    return chunks


def test_concurrent_streams_reassemble_to_their_non_streamed_outputs(engine):
    cases = [(q, p) for q in QUESTIONS for p in PARAMS]

    async def all_streams():
        return await asyncio.gather(*(read(engine, i, q, p) for i, (q, p) in enumerate(cases)))

    for _ in range(2):  # the second round drafts from the tree: the answers are cached
        streamed = asyncio.run(all_streams())
        for i, ((question, params), samples) in enumerate(zip(cases, streamed, strict=True)):
            want = engine.generate(question, params)
            want = want if isinstance(want, list) else [want]
            for chunks, expected in zip(samples, want, strict=True):
                if i in ABORTED:
                    if chunks:  # a prefix of what the whole request makes
                        got = reassemble(chunks)
                        assert expected["token_ids"][: len(got["token_ids"])] == got["token_ids"]
                        assert expected["text"].startswith(got["text"])
                    continue
                got = reassemble(chunks)
                assert chunks[-1]["finished"] and not any(c["finished"] for c in chunks[:-1])
                assert got["token_ids"] == expected["token_ids"]
                assert got["text"] == expected["text"]
                meta = expected["meta_info"]
                assert {k: got["meta_info"][k] for k in USAGE} == {k: meta[k] for k in USAGE}
                if params.return_logprob:
                    assert_logprobs_close(got["logprobs"], meta["output_token_logprobs"])
                    assert len(got["logprobs"]) == len(got["token_ids"])
                if params.top_logprobs_num:
                    assert len(got["top"]) == len(got["token_ids"])
    stats = engine.cache_stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    engine.check_invariants()
