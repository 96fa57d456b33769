"""Errors in OpenAI's shape, and the responses every route documents in the OpenAPI schema."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from pydantic import BaseModel


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status)


def error_doc(description: str) -> dict:
    return {"model": ErrorResponse, "description": description}


# What a route that takes a body (and, with --api-keys, a key) can answer besides 200.
BODY_ERRORS: dict[int | str, dict] = {
    400: error_doc("invalid request: a malformed body, a field out of range, an unsupported field"),
    401: error_doc("a valid API key is required (servers started with --api-keys)"),
    413: error_doc("request body too large"),
}
KEY_ERRORS: dict[int | str, dict] = {401: BODY_ERRORS[401]}
# Routes that stream server-sent events when the body asks for ``stream``.
STREAMING = {
    **BODY_ERRORS,
    200: {
        "description": "the result, or with `stream` a stream of server-sent events",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
}
