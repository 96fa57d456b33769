"""The FastAPI app over one engine (an ``EngineClient``): OpenAI-compatible and native routes
(``routes_openai``, ``routes_responses``, ``routes_native``), errors in OpenAI's shape, a
bound on body size, and a lifespan that logs throughput and stops the engine at shutdown."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.engine.client import EngineClient
from radixserve.server import routes_native, routes_openai, routes_responses
from radixserve.server.errors import ApiError, error_response
from radixserve.server.metrics import ServerMetrics
from radixserve.server.response_store import ResponseStore

logger = logging.getLogger("radixserve.server")
MAX_BODY_BYTES = 8 * 1024 * 1024
SHUTDOWN_COMPLETE = "shutdown complete: engine stopped"


def create_app(
    engine: EngineClient,
    model_name: str,
    api_keys: dict[str, str] | None = None,
    log_interval_s: float = 10.0,
) -> FastAPI:
    """``api_keys`` maps each accepted key to its tenant's cache namespace."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(_log_periodically(engine, log_interval_s))
        try:
            yield
        finally:
            task.cancel()
            engine.shutdown()  # stops admitting; aborts what is in flight
            logger.info(SHUTDOWN_COMPLETE)

    app = FastAPI(title="radixserve", lifespan=lifespan)
    metrics = ServerMetrics(engine)
    app.state.engine = engine
    app.state.model_name = model_name
    app.state.api_keys = api_keys
    app.state.metrics = metrics
    app.state.on_finish = lambda out: _finished(metrics, out)
    app.state.responses = ResponseStore()
    try:  # what frontend programs need to open and close roles themselves
        app.state.chat_format = engine.chat_format.to_dict()
    except ValueError:
        app.state.chat_format = None
    app.include_router(routes_openai.router)
    app.include_router(routes_native.router)
    app.include_router(routes_responses.router)
    _install_error_handlers(app)
    app.openapi = lambda: _openapi(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    app.add_middleware(BoundBody)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if _names_a_field(p))
        return error_response(400, f"{where}: {first.get('msg', 'invalid request')}".strip(": "))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # a body that does not parse, an unknown route: the same error shape as the rest
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.kind)

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError):
        return error_response(400, str(exc))


class BoundBody:
    """Refuses a body whose declared length passes ``MAX_BODY_BYTES`` before it is read. A
    plain ASGI middleware: starlette's ``BaseHTTPMiddleware`` relays every chunk of a
    streamed response through a memory stream and a task of its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = Headers(scope=scope).get("content-length")
            if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
                too_large = error_response(413, f"request body over {MAX_BODY_BYTES} bytes")
                return await too_large(scope, receive, send)
        await self.app(scope, receive, send)


def _names_a_field(part: str | int) -> bool:
    """Whether a part of pydantic's error location is a field name or an index, not the
    body itself or the tag of a union member (``constrained-str``, ``list[int]``)."""
    if isinstance(part, int):
        return True
    return part.isidentifier() and part not in ("body", "str", "int", "float", "bool", "list")


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema, without the 422 it documents for every body: invalid bodies get
    the 400 each route documents."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema["paths"].values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


def _finished(metrics: ServerMetrics, out: dict) -> None:
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


async def _log_periodically(engine: EngineClient, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        s = await asyncio.to_thread(engine.cache_stats)
        logger.info(
            "throughput %.1f tok/s, token hit rate %.1f%%, running %d, waiting %d, KV %.0f%%",
            s["generation_throughput"],
            100 * s["token_hit_rate"],
            s["running"],
            s["waiting"],
            100 * s["kv_usage"],
        )
