"""Server-sent events: the engine's stream chunks in OpenAI's chunk shapes, ending with
``data: [DONE]``, and the usage event when the client asked for it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from fastapi.responses import StreamingResponse

from radixserve.server.chat_output import ChatDeltas, ChatOutput
from radixserve.server.errors import ApiError
from radixserve.server.openai_format import chat_chunk, completion_chunk, usage


def sse(events: AsyncIterator[dict]) -> StreamingResponse:
    """A client that hangs up closes ``events``, and with it the engine's stream, which
    aborts every request still running."""

    async def body() -> AsyncIterator[str]:
        async with aclosing(events):
            try:
                async for event in events:
                    yield f"data: {json.dumps(event)}\n\n"
            except ValueError as exc:
                error = {"message": str(exc), "type": "invalid_request_error"}
                yield f"data: {json.dumps({'error': error})}\n\n"
            except ApiError as exc:  # a failure after the stream started (a replica lost)
                error = {"message": exc.message, "type": exc.kind}
                yield f"data: {json.dumps({'error': error})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def openai_events(
    chunks: AsyncIterator[dict],
    head: dict,
    n: int,
    include_usage: bool,
    on_finish: Callable[[dict], None],
    chat: bool,
    echo: list[str] | None = None,
    output: ChatOutput | None = None,
    logprobs: Callable[[dict], dict] | None = None,
) -> AsyncIterator[dict]:
    """``head``: the fields every event repeats (id, object, created, model). ``echo``: the
    text each prompt's choices open with (completions with ``echo``); ``output``: how a
    chat's text is parsed (reasoning, tool calls); ``logprobs``: a chunk's logprobs object,
    when the client asked for them."""
    metas: dict[int, dict] = {}
    started: set[int] = set()
    parsers: dict[int, ChatDeltas] = {}
    output = output or ChatOutput(None, None)
    async with aclosing(chunks):
        async for chunk in chunks:
            index = chunk["index"]
            first = index not in started
            started.add(index)
            if first and echo is not None:
                chunk = {**chunk, "text": echo[index // n] + chunk["text"]}
            lp = None if logprobs is None else logprobs(chunk)
            if chat:
                deltas = parsers.setdefault(index, output.deltas())
                delta, reason = deltas.step(chunk), deltas.reason(chunk)
                yield chat_chunk(head, index, delta, first, reason, lp)
            else:
                yield completion_chunk(head, index, chunk, lp)
            if chunk["finished"]:
                metas[index] = {"rid": chunk["rid"], "meta_info": chunk["meta_info"]}
                on_finish(metas[index])
    if include_usage:  # choices in index order, so each prompt's n samples group together
        yield {**head, "choices": [], "usage": usage([metas[i] for i in sorted(metas)], n)}
