"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``."""

from __future__ import annotations

import time
import uuid
from functools import partial

from fastapi import APIRouter, Depends, Request

from radixserve.engine import SamplingParams
from radixserve.engine.client import EngineClient
from radixserve.server.auth import namespace, tenant
from radixserve.server.chat_output import ChatOutput
from radixserve.server.errors import KEY_ERRORS, STREAMING, ApiError
from radixserve.server.openai_format import (
    chat_choice,
    chat_logprobs,
    completion_choice,
    completion_logprobs,
    usage,
)
from radixserve.server.protocol import ChatCompletionRequest, CompletionRequest
from radixserve.server.streaming import openai_events, sse

router = APIRouter()


def check_model(request: Request, name: str | None) -> None:
    served = request.app.state.model_name
    if name is not None and name != served:
        raise ApiError(400, f"model {name!r} is not served here; use {served!r}")


def _head(request: Request, kind: str, prefix: str) -> dict:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": request.app.state.model_name,
    }


async def _run(
    request: Request, source: dict, params: SamplingParams, ns: object, affinity: str | None
) -> list:
    engine: EngineClient = request.app.state.engine
    outs = await engine.async_generate(
        sampling_params=params, namespace=ns, affinity=affinity, **source
    )
    outs = outs if isinstance(outs, list) else [outs]
    for out in outs:
        request.app.state.on_finish(out)
    return outs


@router.get("/v1/models", responses=KEY_ERRORS)
async def models(request: Request, _: str | None = Depends(tenant)):
    name, engine = request.app.state.model_name, request.app.state.engine
    entry = {"id": name, "object": "model", "created": 0, "owned_by": "radixserve"}
    entry["max_model_len"] = engine.context_len  # as vLLM's and SGLang's cards say
    return {"object": "list", "data": [entry]}


@router.post("/v1/completions", responses=STREAMING)
async def completions(
    body: CompletionRequest, request: Request, tenant_ns: str | None = Depends(tenant)
):
    check_model(request, body.model)
    engine: EngineClient = request.app.state.engine
    logprobs = body.logprobs is not None
    params = body.sampling(
        16,
        n=body.n,
        return_logprob=logprobs,
        top_logprobs_num=body.logprobs or 0,
        # echoed prompts come with their own logprobs
        logprob_start_len=0 if body.echo and logprobs else -1,
    )
    source = body.prompts()

    def echoed() -> list[str] | None:
        """Each prompt's text, which its choices open with; decoded once the engine has
        accepted the ids (out-of-vocabulary ones are its 400 to give)."""
        if not body.echo:
            return None
        return source.get("prompt") or [engine.tokenizer.decode(i) for i in source["input_ids"]]

    ns = namespace(tenant_ns, body.cache_salt)
    head = _head(request, "text_completion", "cmpl")
    if body.stream:
        await engine.check_grammar(params)  # a bad grammar is a 400, not an error event
        chunks = engine.generate_stream(
            sampling_params=params, namespace=ns, affinity=body.prompt_cache_key, **source
        )
        include = bool(body.stream_options and body.stream_options.include_usage)
        on_finish = request.app.state.on_finish
        render = partial(completion_logprobs, engine.tokenizer) if logprobs else None
        events = openai_events(
            chunks, head, body.n, include, on_finish, False, echoed(), logprobs=render
        )
        return sse(events)
    outs = await _run(request, source, params, ns, body.prompt_cache_key)
    echo = echoed()
    choices = [
        completion_choice(
            i, o, engine.tokenizer, logprobs, None if echo is None else echo[i // body.n]
        )
        for i, o in enumerate(outs)
    ]
    return {**head, "choices": choices, "usage": usage(outs, body.n)}


@router.post("/v1/chat/completions", responses=STREAMING)
async def chat(
    body: ChatCompletionRequest, request: Request, tenant_ns: str | None = Depends(tenant)
):
    check_model(request, body.model)
    engine: EngineClient = request.app.state.engine
    messages = [m.for_template() for m in body.messages]
    kwargs = body.chat_template_kwargs or {}
    ids = engine.apply_chat_template(messages, tools=body.tool_dicts(), **kwargs)
    tools = body.plan(engine.tool_format)
    output = ChatOutput(engine.reasoning_format, tools)
    k = body.top_logprobs or 0
    forced = {"ebnf": tools.grammar()} if tools is not None and tools.forced else {}
    params = body.sampling(
        256, n=body.n, return_logprob=body.logprobs, top_logprobs_num=k, **forced
    )
    ns = namespace(tenant_ns, body.cache_salt)
    if body.stream:
        await engine.check_grammar(params)
        head = _head(request, "chat.completion.chunk", "chatcmpl")
        chunks = engine.generate_stream(
            input_ids=ids, sampling_params=params, namespace=ns, affinity=body.prompt_cache_key
        )
        include = bool(body.stream_options and body.stream_options.include_usage)
        on_finish = request.app.state.on_finish
        render = partial(chat_logprobs, engine.tokenizer) if body.logprobs else None
        events = openai_events(
            chunks, head, body.n, include, on_finish, True, output=output, logprobs=render
        )
        return sse(events)
    outs = await _run(request, {"input_ids": ids}, params, ns, body.prompt_cache_key)
    head = _head(request, "chat.completion", "chatcmpl")
    tok = engine.tokenizer
    choices = [chat_choice(i, o, tok, body.logprobs, output) for i, o in enumerate(outs)]
    return {**head, "choices": choices, "usage": usage(outs, body.n)}
