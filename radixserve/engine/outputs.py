"""What the engine hands back: a finished request's output, and a stream's chunks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from radixserve.chat.held_back import stable_text
from radixserve.engine.req import Req

# called on the scheduler thread with the request and whether it finished
Listener = Callable[[Req, bool], None]


def request_output(req: Req) -> dict:
    end = req.finish_s or time.perf_counter()
    meta = {
        "prompt_tokens": len(req.input_ids),
        "cached_tokens": req.prompt_cached_tokens,
        "cached_tokens_by_tier": dict(req.prompt_cached_by_tier)
        or {"device": req.prompt_cached_tokens, "host": 0, "disk": 0},
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
        out["output_token_logprobs"] = req.output_logprobs[start:end]
        if p.top_logprobs_num:
            out["output_top_logprobs"] = req.output_top_logprobs[start:end]
    return out


def prompt_logprobs(req: Req) -> dict:
    """The prompt's logprobs from ``logprob_start_len`` on, when the request asked for them
    (the first token has no context, so no logprob and no alternatives: ``None``)."""
    p, out = req.params, {}
    if p.prompt_logprobs:
        ids = req.input_ids.tolist()
        positions = range(p.logprob_start_len, len(ids))
        out["input_token_logprobs"] = [(req.input_logprobs.get(i), ids[i]) for i in positions]
        if p.top_logprobs_num:
            out["input_top_logprobs"] = [req.input_top_logprobs.get(i) for i in positions]
    return out


class StreamCursor:
    """What one request's stream has sent so far. Read on the caller's event loop while the
    scheduler thread extends the request: each chunk takes whatever is there now."""

    def __init__(self, req: Req, index: int) -> None:
        self.req, self.index = req, index
        self.tokens, self.text, self.first = 0, "", True

    def chunk(self, done: bool) -> dict | None:
        """The next chunk: new token ids and the text they settled (a tail that could still
        become a stop string waits); ``None`` when there is nothing new."""
        req = self.req
        ids = req.output_ids[self.tokens :]
        if req.params.return_logprob:  # a verified draft's tokens get theirs just after
            ids = ids[: max(0, len(req.output_logprobs) - self.tokens)]
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
    """Submit ``reqs`` (after awaiting ``prepare``) and yield their chunks as the scheduler
    thread advances them, through one queue on the caller's loop; closing early aborts the
    unfinished ones."""
    if prepare is not None:
        await prepare()
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()

    def listener(index: int) -> Listener:
        def notify(_: Req, done: bool) -> None:
            # a caller whose loop has closed reads nothing any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, (index, done))

        return notify

    cursors = [StreamCursor(req, i) for i, req in enumerate(reqs)]
    for i, req in enumerate(reqs):
        submit(req, listener(i))
    live = len(reqs)
    try:
        while live:
            index, done = await queue.get()
            live -= done
            if (chunk := cursors[index].chunk(done)) is not None:
                yield chunk
    finally:
        if not stopping():
            for req in reqs:
                if not req.finished:
                    abort(req.rid)
