"""Native and operational routes: ``/generate`` (like ``Engine.generate``), tokenizing,
health, metrics, server info, the cache audit and flush."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from radixserve.cache import CacheInvariantError
from radixserve.engine.client import EngineClient
from radixserve.server.auth import namespace, tenant
from radixserve.server.errors import BODY_ERRORS, STREAMING
from radixserve.server.protocol import DetokenizeRequest, GenerateRequest, TokenizeRequest
from radixserve.server.routes_openai import check_model
from radixserve.server.streaming import sse

router = APIRouter()


@router.get("/health")
async def health():
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(request: Request):
    metrics = request.app.state.metrics
    text = await asyncio.to_thread(metrics.render)
    return PlainTextResponse(text, media_type=metrics.content_type)


@router.get("/server_info")
async def server_info(request: Request):
    state = request.app.state
    engine: EngineClient = state.engine
    stats = await asyncio.to_thread(engine.cache_stats)
    return {
        "model": state.model_name,
        "config": engine.config.__dict__,
        "context_len": engine.context_len,
        "chat_format": state.chat_format,
        "tool_format": engine.tool_format.name,
        "cpu_profile": engine.cpu_profile.to_dict() if engine.cpu_profile else None,
        "weights": engine.weights,
        **stats,
    }


@router.post("/tokenize", responses=BODY_ERRORS)
async def tokenize(body: TokenizeRequest, request: Request, _: str | None = Depends(tenant)):
    check_model(request, body.model)
    engine: EngineClient = request.app.state.engine
    tokens = engine.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"]
    return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.context_len}


@router.post("/detokenize", responses=BODY_ERRORS)
async def detokenize(body: DetokenizeRequest, request: Request, _: str | None = Depends(tenant)):
    check_model(request, body.model)
    engine: EngineClient = request.app.state.engine
    if any(t >= engine.vocab_size for t in body.tokens):
        raise ValueError(f"token ids must lie in [0, {engine.vocab_size})")
    return {"prompt": engine.tokenizer.decode(body.tokens)}


@router.get("/check_invariants", responses={500: {"description": "the audit failed"}})
async def check_invariants(request: Request):
    """Audit cache and slot accounting; load checks call it after a run."""
    try:
        await asyncio.to_thread(request.app.state.engine.check_invariants)
    except CacheInvariantError as exc:
        return JSONResponse({"ok": False, "error": str(exc)}, status_code=500)
    return {"ok": True}


@router.post("/flush_cache", responses={409: {"description": "requests are running"}})
async def flush_cache(request: Request):
    flushed = await asyncio.to_thread(request.app.state.engine.flush_cache)
    return JSONResponse({"flushed": flushed}, status_code=200 if flushed else 409)


@router.post("/generate", responses=STREAMING)
async def generate(
    body: GenerateRequest, request: Request, tenant_ns: str | None = Depends(tenant)
):
    engine: EngineClient = request.app.state.engine
    params = body.sampling()
    source = {"prompt": body.text} if body.text is not None else {"input_ids": body.input_ids}
    ns = namespace(tenant_ns, body.cache_salt)
    if body.stream:
        await engine.check_grammar(params)
        return sse(
            _finished_seen(
                request, engine.generate_stream(sampling_params=params, namespace=ns, **source)
            )
        )
    outs = await engine.async_generate(sampling_params=params, namespace=ns, **source)
    for out in outs if isinstance(outs, list) else [outs]:
        request.app.state.on_finish(out)
    return outs


async def _finished_seen(request: Request, chunks):
    async with aclosing(chunks):  # a hang-up closes the engine's stream too, at once
        async for chunk in chunks:
            if chunk["finished"]:
                meta = chunk["meta_info"]
                request.app.state.on_finish({"rid": chunk["rid"], "meta_info": meta})
            yield chunk
