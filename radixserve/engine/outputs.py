"""What the engine hands back: a finished request's output, and a stream's chunks.

Both are built by the thread that runs the engine's steps, right after one, and handed over
as fresh dicts it never touches again: nothing on the caller's side reads a ``Req``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from radixserve.chat.held_back import stable_text
from radixserve.engine.req import Req

# called after a step, by the thread that ran it, with the request and whether it finished
Listener = Callable[[Req, bool], None]


def request_output(req: Req) -> dict:
    end = req.finish_s or time.perf_counter()
    meta = {
        "prompt_tokens": len(req.input_ids),
        "cached_tokens": req.kv.prompt_cached_tokens,
        "cached_tokens_by_tier": dict(req.kv.prompt_cached_by_tier)
        or {"device": req.kv.prompt_cached_tokens, "host": 0, "disk": 0},
        "completion_tokens": len(req.output_ids),
        "finish_reason": {"type": req.finish_reason, "matched": req.matched_stop},
        "ttft_s": (req.first_token_s or end) - req.arrival_s,
        "latency_s": end - req.arrival_s,
    }
    meta |= output_logprobs(req, 0, len(req.output_ids)) | prompt_logprobs(req)
    return {"rid": req.rid, "text": req.text, "token_ids": list(req.output_ids), "meta_info": meta}


def output_logprobs(req: Req, start: int, end: int) -> dict:
    """The logprobs of output tokens ``start:end`` (and their top alternatives), when the
    request asked for them."""
    p, out = req.params, {}
    if p.return_logprob:
        out["output_token_logprobs"] = req.logprobs.output[start:end]
        if p.top_logprobs_num:
            out["output_top_logprobs"] = req.logprobs.output_top[start:end]
    return out


def prompt_logprobs(req: Req) -> dict:
    """The prompt's logprobs from ``logprob_start_len`` on, when the request asked for them
    (the first token has no context, so no logprob and no alternatives: ``None``)."""
    p, out = req.params, {}
    if p.prompt_logprobs:
        ids = req.input_ids.tolist()
        positions = range(p.logprob_start_len, len(ids))
        recorded = req.logprobs
        out["input_token_logprobs"] = [(recorded.prompt.get(i), ids[i]) for i in positions]
        if p.top_logprobs_num:
            out["input_top_logprobs"] = [recorded.prompt_top.get(i) for i in positions]
    return out


class StreamCursor:
    """What one request's stream has sent so far; used by the engine's step thread after
    each step that gave the request tokens."""

    def __init__(self, req: Req, index: int) -> None:
        self.req, self.index = req, index
        self.tokens, self.text, self.first = 0, "", True

    def chunk(self, done: bool) -> dict | None:
        """The next chunk: new token ids and the text they settled (a tail that could still
        become a stop string waits); ``None`` when there is nothing new."""
        req = self.req
        ids = req.output_ids[self.tokens :]
        if req.params.return_logprob:  # never a token ahead of its logprobs
            ids = ids[: max(0, len(req.logprobs.output) - self.tokens)]
        text = req.text if done else stable_text(req.text, req.params.stop)
        if not ids and not done:
            return None
        chunk = {
            "index": self.index,
            "rid": req.rid,
            "text": text[len(self.text) :],
            "token_ids": ids,
            "finished": done,
        }
        chunk |= output_logprobs(req, self.tokens, self.tokens + len(ids))
        if self.first:  # the prompt's logprobs, when asked, come with the first chunk
            chunk |= prompt_logprobs(req)
            self.first = False
        self.tokens += len(ids)
        self.text = text
        if done:
            chunk["meta_info"] = request_output(req)["meta_info"]
        return chunk


async def stream_outputs(
    reqs: list[Req],
    submit: Callable[[Req, Listener], object],
    abort: Callable[[str], None],
    stopping: Callable[[], bool],
    prepare: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[dict]:
    """Submit ``reqs`` (after awaiting ``prepare``) and yield their chunks, built by the
    engine's step thread as it advances them and passed through one queue on the caller's
    loop; closing early aborts the unfinished ones."""
    if prepare is not None:
        await prepare()
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, dict, bool]] = asyncio.Queue()

    def listener(index: int, cursor: StreamCursor) -> Listener:
        def notify(_: Req, done: bool) -> None:  # on the engine's step thread
            chunk = cursor.chunk(done)
            if chunk is None:
                return
            # a caller whose loop has closed reads nothing any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, (index, chunk, done))

        return notify

    rids = [req.rid for req in reqs]
    for i, req in enumerate(reqs):
        submit(req, listener(i, StreamCursor(req, i)))
    live = set(range(len(reqs)))
    try:
        while live:
            index, chunk, done = await queue.get()
            if done:
                live.discard(index)
            yield chunk
    finally:
        if not stopping():
            for index in live:
                abort(rids[index])
