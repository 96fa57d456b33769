"""Stored responses, so a next turn can name one as ``previous_response_id``: its token ids
(prompt and answer, exactly as the engine saw and wrote them) and the chat that produced
them. Bounded in responses and in tokens, least recently used out first; a response is
found only by the tenant that created it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredResponse:
    tenant: str | None
    ids: tuple[int, ...]  # the prompt's token ids, then the answer's
    prompt_messages: tuple[dict, ...]  # the chat the prompt rendered (instructions included)
    answer: str  # the answer's text as generated (tool calls as the model wrote them)
    stop_token: int | None  # the token the answer ended on (in ``ids``), if any
    tools_key: str  # what the prompt's tool section was rendered from
    instructions: str | None
    body: dict  # the response object, for GET /v1/responses/{id}


class ResponseStore:
    def __init__(self, max_responses: int = 1024, max_tokens: int = 4_000_000) -> None:
        self.max_responses, self.max_tokens = max_responses, max_tokens
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, item: StoredResponse) -> None:
        with self._lock:
            self._items[response_id] = item
            self._tokens += len(item.ids)
            while self._items and (
                len(self._items) > self.max_responses or self._tokens > self.max_tokens
            ):
                _, old = self._items.popitem(last=False)
                self._tokens -= len(old.ids)

    def get(self, response_id: str, tenant: str | None) -> StoredResponse | None:
        """The response, if it is stored and ``tenant`` created it."""
        with self._lock:
            item = self._items.get(response_id)
            if item is None or item.tenant != tenant:
                return None
            self._items.move_to_end(response_id)
            return item

    def delete(self, response_id: str, tenant: str | None) -> bool:
        with self._lock:
            item = self._items.get(response_id)
            if item is None or item.tenant != tenant:
                return False
            del self._items[response_id]
            self._tokens -= len(item.ids)
            return True

    def __len__(self) -> int:
        return len(self._items)
