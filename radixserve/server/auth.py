"""API keys and cache namespaces: the tenant comes from the key, never from the client."""

from __future__ import annotations

from fastapi import Request

from radixserve.server.errors import ApiError


def tenant(request: Request) -> str | None:
    """The caller's tenant (a dependency of every route that reads or writes the cache);
    ``None`` on a server started without keys."""
    api_keys: dict[str, str] | None = request.app.state.api_keys
    if api_keys is None:
        return None
    header = request.headers.get("authorization", "")
    key = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else None
    if key not in api_keys:
        raise ApiError(401, "a valid API key is required", "authentication_error")
    return api_keys[key]


def namespace(tenant_ns: str | None, salt: str | None) -> object:
    """The cache namespace of a request: its tenant's, subdivided by ``cache_salt``."""
    if tenant_ns is None and salt is None:
        return None
    return (tenant_ns, salt)
