"""The FastAPI app: OpenAI-compatible completions and chat, the native ``/generate``, and
operational routes. Each route turns a validated body into engine calls; the engine does
the rest on its own thread."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from radixserve.cache import CacheInvariantError
from radixserve.engine import Engine, SamplingParams
from radixserve.model.chat_format import ChatFormat
from radixserve.server.metrics import ServerMetrics
from radixserve.server.openai_format import (
    chat_choice,
    chat_chunk,
    completion_choice,
    completion_chunk,
    usage,
)
from radixserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
)

logger = logging.getLogger("radixserve.server")
MAX_BODY_BYTES = 8 * 1024 * 1024
SHUTDOWN_COMPLETE = "shutdown complete: engine stopped"


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status)


def create_app(
    engine: Engine,
    model_name: str,
    api_keys: dict[str, str] | None = None,
    log_interval_s: float = 10.0,
) -> FastAPI:
    """``api_keys`` maps each accepted key to its tenant's cache namespace."""
    metrics = ServerMetrics(engine)

    async def periodic_log() -> None:
        while True:
            await asyncio.sleep(log_interval_s)
            s = await asyncio.to_thread(engine.cache_stats)
            logger.info(
                "throughput %.1f tok/s, token hit rate %.1f%%, running %d, waiting %d, KV %.0f%%",
                s["generation_throughput"],
                100 * s["token_hit_rate"],
                s["running"],
                s["waiting"],
                100 * s["kv_usage"],
            )

    async def lifespan(app: FastAPI):
        task = asyncio.create_task(periodic_log())
        yield
        task.cancel()
        engine.shutdown()  # stops admitting; aborts what is in flight
        logger.info(SHUTDOWN_COMPLETE)

    app = FastAPI(title="radixserve", lifespan=lifespan)

    @app.middleware("http")
    async def bound_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and int(length) > MAX_BODY_BYTES:
            return _error(413, f"request body over {MAX_BODY_BYTES} bytes")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}".strip(": "))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return _error(exc.status, exc.message, exc.kind)

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError):
        return _error(400, str(exc))

    def tenant(request: Request) -> str | None:
        if api_keys is None:
            return None
        header = request.headers.get("authorization", "")
        key = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else None
        if key not in api_keys:
            raise ApiError(401, "a valid API key is required", "authentication_error")
        return api_keys[key]

    def namespace(tenant_ns: str | None, salt: str | None) -> object:
        # The tenant comes from the key, never from the client; the salt only subdivides it.
        if tenant_ns is None and salt is None:
            return None
        return (tenant_ns, salt)

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise ApiError(400, f"model {name!r} is not served here; use {model_name!r}")

    def finished(out: dict) -> None:
        meta = out["meta_info"]
        metrics.observe(meta)
        logger.info(
            "request %s: prompt %d, cached %d, completion %d tokens, TTFT %.3f s",
            out["rid"],
            meta["prompt_tokens"],
            meta["cached_tokens"],
            meta["completion_tokens"],
            meta["ttft_s"],
        )

    async def run_all(jobs: list[tuple[dict, SamplingParams]], ns: object) -> list[dict]:
        outs = await asyncio.gather(
            *(engine.async_generate(sampling_params=p, namespace=ns, **src) for src, p in jobs)
        )
        flat = [o for out in outs for o in (out if isinstance(out, list) else [out])]
        for out in flat:
            finished(out)
        return flat

    async def stream_all(
        jobs: list[tuple[dict, SamplingParams]], ns: object
    ) -> AsyncIterator[tuple[int, dict]]:
        """Chunks of every job's stream as they come, tagged with the choice index."""
        queue: asyncio.Queue = asyncio.Queue()
        streams = []
        for src, params in jobs:
            for _ in range(params.n):
                one = SamplingParams(**{**params.__dict__, "n": 1})
                streams.append(engine.generate_stream(sampling_params=one, namespace=ns, **src))

        async def pump(index: int, stream) -> None:
            try:
                async for chunk in stream:
                    await queue.put((index, chunk))
            except Exception as exc:  # surfaced to the consumer
                await queue.put((index, exc))
            finally:
                await queue.put((index, None))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        try:
            live = len(tasks)
            while live:
                index, chunk = await queue.get()
                if chunk is None:
                    live -= 1
                    continue
                if isinstance(chunk, Exception):
                    raise chunk
                if chunk["finished"]:
                    finished({"rid": chunk["rid"], "meta_info": chunk["meta_info"]})
                yield index, chunk
        finally:  # a client that went away aborts every stream (each closes and aborts)
            for task in tasks:
                task.cancel()
            for stream in streams:
                await stream.aclose()

    def sse(events: AsyncIterator[dict]) -> StreamingResponse:
        async def body() -> AsyncIterator[str]:
            try:
                async for event in events:
                    yield f"data: {json.dumps(event)}\n\n"
            except ValueError as exc:
                error = {"message": str(exc), "type": "invalid_request_error"}
                yield f"data: {json.dumps({'error': error})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    def prompt_jobs(body: CompletionRequest, params: SamplingParams) -> list[dict]:
        p = body.prompt
        if isinstance(p, str):
            return [{"prompt": p}]
        if p and all(isinstance(x, int) for x in p):
            return [{"input_ids": p}]
        if p and all(isinstance(x, str) for x in p):
            return [{"prompt": x} for x in p]
        if p and all(isinstance(x, list) for x in p):
            return [{"input_ids": x} for x in p]
        raise ValueError("prompt must be a string, a list of strings or token ids")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(_: str | None = Depends(tenant)):
        entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "radixserve"}
        return {"object": "list", "data": [entry]}

    @app.get("/metrics")
    async def prometheus():
        text = await asyncio.to_thread(metrics.render)
        return PlainTextResponse(text, media_type=metrics.content_type)

    try:  # what frontend programs need to open and close roles themselves
        chat_format = ChatFormat.from_tokenizer(engine.tokenizer).to_dict()
    except ValueError:
        chat_format = None

    @app.get("/server_info")
    async def server_info():
        stats = await asyncio.to_thread(engine.cache_stats)
        return {
            "model": model_name,
            "config": engine.config.__dict__,
            "context_len": engine.context_len,
            "chat_format": chat_format,
            **stats,
        }

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, _: str | None = Depends(tenant)):
        check_model(body.model)
        ids = engine.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)
        tokens = ids["input_ids"]
        return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.context_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, _: str | None = Depends(tenant)):
        check_model(body.model)
        if any(t < 0 or t >= engine.vocab_size for t in body.tokens):
            raise ValueError(f"token ids must lie in [0, {engine.vocab_size})")
        return {"prompt": engine.tokenizer.decode(body.tokens)}

    @app.get("/check_invariants")
    async def check_invariants():
        """Audit cache and slot accounting; load checks call it after a run."""
        try:
            await asyncio.to_thread(engine.check_invariants)
        except CacheInvariantError as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=500)
        return {"ok": True}

    @app.post("/flush_cache")
    async def flush_cache():
        flushed = await asyncio.to_thread(engine.flush_cache)
        return JSONResponse({"flushed": flushed}, status_code=200 if flushed else 409)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, tenant_ns: str | None = Depends(tenant)):
        check_model(body.model)
        k = body.logprobs or 0
        params = body.sampling(
            16, n=body.n, return_logprob=body.logprobs is not None, top_logprobs_num=k
        )
        jobs = [(src, params) for src in prompt_jobs(body, params)]
        ns = namespace(tenant_ns, body.cache_salt)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        tok = engine.tokenizer
        if body.stream:
            return sse(
                _completion_events(stream_all(jobs, ns), rid, created, model_name, tok, body)
            )
        outs = await run_all(jobs, ns)
        choices = [
            completion_choice(i, o, tok, k if body.logprobs is not None else None)
            for i, o in enumerate(outs)
        ]
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model_name,
            "choices": choices,
            "usage": usage(outs, body.n),
        }

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, tenant_ns: str | None = Depends(tenant)):
        check_model(body.model)
        tok = engine.tokenizer
        messages = [m.model_dump() for m in body.messages]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        k = body.top_logprobs or 0
        params = body.sampling(256, n=body.n, return_logprob=body.logprobs, top_logprobs_num=k)
        jobs = [({"input_ids": ids}, params)]
        ns = namespace(tenant_ns, body.cache_salt)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            return sse(_chat_events(stream_all(jobs, ns), rid, created, model_name, body))
        outs = await run_all(jobs, ns)
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model_name,
            "choices": [chat_choice(i, o, tok, body.logprobs) for i, o in enumerate(outs)],
            "usage": usage(outs, body.n),
        }

    @app.post("/generate")
    async def generate(body: GenerateRequest, tenant_ns: str | None = Depends(tenant)):
        if (body.text is None) == (body.input_ids is None):
            raise ValueError("pass exactly one of text and input_ids")
        params = SamplingParams(
            **body.sampling_params,
            return_logprob=body.return_logprob,
            logprob_start_len=body.logprob_start_len,
            top_logprobs_num=body.top_logprobs_num,
        )
        src: dict[str, Any] = (
            {"prompt": body.text} if body.text is not None else {"input_ids": body.input_ids}
        )
        ns = namespace(tenant_ns, body.cache_salt)
        if body.stream:

            async def events() -> AsyncIterator[dict]:
                async for _, chunk in stream_all([(src, params)], ns):
                    yield chunk

            return sse(events())
        outs = await engine.async_generate(sampling_params=params, namespace=ns, **src)
        for out in outs if isinstance(outs, list) else [outs]:
            finished(out)
        return outs

    return app


async def _completion_events(chunks, rid, created, model, tok, body) -> AsyncIterator[dict]:
    metas = []
    async for index, chunk in chunks:
        yield completion_chunk(rid, created, model, index, chunk)
        if chunk["finished"]:
            metas.append({"meta_info": chunk["meta_info"]})
    if body.stream_options and body.stream_options.include_usage:
        yield _usage_event(rid, "text_completion", created, model, metas, body.n)


async def _chat_events(chunks, rid, created, model, body) -> AsyncIterator[dict]:
    metas, started = [], set()
    async for index, chunk in chunks:
        first = index not in started
        started.add(index)
        yield chat_chunk(rid, created, model, index, chunk, first)
        if chunk["finished"]:
            metas.append({"meta_info": chunk["meta_info"]})
    if body.stream_options and body.stream_options.include_usage:
        yield _usage_event(rid, "chat.completion.chunk", created, model, metas, body.n)


def _usage_event(rid: str, kind: str, created: int, model: str, metas: list, n: int) -> dict:
    """The last streamed event when the client asked for usage: no choices, only usage."""
    usage_ = usage(metas, n)
    return {
        "id": rid,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }
