"""The OpenAI-compatible HTTP server (``radixserve serve``)."""

from radixserve.server.app import create_app

__all__ = ["create_app"]
