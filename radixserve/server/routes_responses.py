"""OpenAI's Responses API: ``POST /v1/responses`` (text and function tools, streamed events),
``GET`` and ``DELETE /v1/responses/{id}``.

A response named by ``previous_response_id`` is continued from its stored token ids: the
next prompt is those ids (prompt and answer, exactly as the engine saw and wrote them) plus
the template's text for what follows, so the whole history is a cache hit by construction.
Where the new turn changes the instructions or the tools, or the template re-renders earlier
turns, the chat is rendered afresh instead.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request

from radixserve.chat.templates import continuation_ids
from radixserve.engine.client import EngineClient
from radixserve.server.auth import namespace, tenant
from radixserve.server.chat_output import ChatOutput
from radixserve.server.errors import KEY_ERRORS, STREAMING, ApiError, error_doc
from radixserve.server.response_store import ResponseStore, StoredResponse
from radixserve.server.responses_output import (
    new_id,
    output_items,
    response_events,
    response_object,
)
from radixserve.server.responses_protocol import ResponsesRequest, tools_key
from radixserve.server.routes_openai import check_model
from radixserve.server.streaming import sse

router = APIRouter()
NOT_FOUND = {**KEY_ERRORS, 404: error_doc("no such response is stored for this key")}


def _system(instructions: str | None) -> list[dict]:
    return [{"role": "system", "content": instructions}] if instructions else []


def _prompt(engine: EngineClient, body: ResponsesRequest, earlier: StoredResponse | None, tools):
    """The chat the prompt renders (instructions apart) and its token ids."""
    new = body.messages()
    if earlier is None:
        return new, engine.apply_chat_template(_system(body.instructions) + new, tools=tools)
    history = [*earlier.prompt_messages, {"role": "assistant", "content": earlier.answer}]
    if body.instructions == earlier.instructions and tools_key(body) == earlier.tools_key:
        ended_on = (
            None if earlier.stop_token is None else engine.tokenizer.decode([earlier.stop_token])
        )
        rest = continuation_ids(
            engine.tokenizer,
            _system(earlier.instructions) + list(earlier.prompt_messages),
            earlier.answer,
            ended_on,
            new,
            tools,
            engine.tool_format,
        )
        if rest is not None:
            return history + new, [*earlier.ids, *rest]
    # new instructions replace the earlier ones, as OpenAI's do; new tools re-render too
    messages = _system(body.instructions) + history + new
    return history + new, engine.apply_chat_template(messages, tools=tools)


@router.post("/v1/responses", responses={**STREAMING, 404: NOT_FOUND[404]})
async def create_response(
    body: ResponsesRequest, request: Request, tenant_ns: str | None = Depends(tenant)
):
    check_model(request, body.model)
    engine: EngineClient = request.app.state.engine
    store: ResponseStore = request.app.state.responses
    earlier = None
    if body.previous_response_id is not None:
        earlier = store.get(body.previous_response_id, tenant_ns)
        if earlier is None:
            raise ApiError(404, f"no response {body.previous_response_id!r} is stored here")
    fields = body.tool_fields()
    tools = fields.tool_dicts()
    messages, ids = _prompt(engine, body, earlier, tools)
    plan = fields.plan(engine.tool_format, body.max_tool_calls)
    output = ChatOutput(engine.reasoning_format, plan)
    forced = {"ebnf": plan.grammar()} if plan is not None and plan.forced else {}
    params = body.sampling(**forced)
    ns = namespace(tenant_ns, None)
    head = {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": request.app.state.model_name,
        "instructions": body.instructions,
        "previous_response_id": body.previous_response_id,
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
        "tool_choice": body.tool_choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls,
        "max_output_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "store": body.store,
        "metadata": body.metadata or {},
        "text": body.text.model_dump(by_alias=True) if body.text else {"format": {"type": "text"}},
        "error": None,
        "incomplete_details": None,
    }

    def keep(response: dict, text: str, token_ids: list[int], finished: dict) -> None:
        request.app.state.on_finish(finished)
        meta = finished["meta_info"]
        if not body.store:
            return
        matched = meta["finish_reason"].get("matched")
        stored = StoredResponse(
            tenant=tenant_ns,
            ids=(*ids, *token_ids),
            prompt_messages=tuple(messages),
            answer=text,
            stop_token=matched if isinstance(matched, int) else None,
            tools_key=tools_key(body),
            instructions=body.instructions,
            body=response,
        )
        store.put(response["id"], stored)

    if body.stream:
        await engine.check_grammar(params)
        chunks = engine.generate_stream(
            input_ids=ids, sampling_params=params, namespace=ns, affinity=body.prompt_cache_key
        )
        return sse(response_events(chunks, head, output, keep))
    out = await engine.async_generate(
        input_ids=ids, sampling_params=params, namespace=ns, affinity=body.prompt_cache_key
    )
    response = response_object(head, output_items(output, out["text"]), out["meta_info"])
    keep(response, out["text"], out["token_ids"], out)
    return response


@router.get("/v1/responses/{response_id}", responses=NOT_FOUND)
async def get_response(response_id: str, request: Request, tenant_ns: str | None = Depends(tenant)):
    stored = request.app.state.responses.get(response_id, tenant_ns)
    if stored is None:
        raise ApiError(404, f"no response {response_id!r} is stored here")
    return stored.body


@router.delete("/v1/responses/{response_id}", responses=NOT_FOUND)
async def delete_response(
    response_id: str, request: Request, tenant_ns: str | None = Depends(tenant)
):
    if not request.app.state.responses.delete(response_id, tenant_ns):
        raise ApiError(404, f"no response {response_id!r} is stored here")
    return {"id": response_id, "object": "response", "deleted": True}
