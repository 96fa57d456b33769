"""An answer as a Responses API response: output items (reasoning, the message, function
calls), built whole or as the stream of events that adds them one by one; both end in the
same response object."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from radixserve.server.chat_output import ChatOutput


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [part] if status == "completed" else []}  # fmt: skip


def reasoning_item(item_id: str, text: str) -> dict:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content}


def call_item(call: dict, status: str = "completed") -> dict:
    """A chat ``tool_calls`` entry as a function call item (its id is the call id)."""
    arguments = call["function"]["arguments"] if status == "completed" else ""
    return {"type": "function_call", "id": new_id("fc"), "call_id": call["id"],
            "name": call["function"]["name"], "arguments": arguments, "status": status}  # fmt: skip


def output_items(output: ChatOutput, text: str) -> list[dict]:
    """A whole answer's items: reasoning, then the message, then the calls."""
    message, _ = output.message(text)
    items = []
    if message.get("reasoning_content") is not None:
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"]))
    if message["content"] is not None:
        items.append(message_item(new_id("msg"), message["content"]))
    items += [call_item(call) for call in message.get("tool_calls", [])]
    return items


def response_object(head: dict, items: list[dict], meta: dict | None) -> dict:
    """The response: ``head`` (id, model, the request's settings) with its output and, once
    done (``meta`` given), its status and usage."""
    out: dict[str, Any] = {**head, "output": items, "status": "in_progress"}
    if meta is None:
        return out
    length = meta["finish_reason"]["type"] == "length"
    out["status"] = "incomplete" if length else "completed"
    out["incomplete_details"] = {"reason": "max_output_tokens"} if length else None
    out["completed_at"] = None if length else int(time.time())
    out["usage"] = {
        "input_tokens": meta["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": meta["cached_tokens"]},
        "output_tokens": meta["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
    }
    return out


class _Events:
    """The stream's events in order, numbered."""

    def __init__(self) -> None:
        self.sequence = 0
        self.items: list[dict] = []
        self.open: dict | None = None  # the reasoning or message item being written
        self.text = ""

    def event(self, kind: str, **fields: Any) -> dict:
        self.sequence += 1
        return {"type": f"response.{kind}", "sequence_number": self.sequence - 1, **fields}

    def begin(self, item: dict) -> list[dict]:
        self.items.append(item)
        return [self.event("output_item.added", output_index=len(self.items) - 1, item=item)]

    def write(self, kind: str, text: str) -> list[dict]:
        """``text`` into the open item of ``kind`` (reasoning or message), opened first."""
        events = []
        if self.open is not None and self.open["type"] != kind:
            events += self.close()
        if self.open is None:
            item_id = new_id("rs" if kind == "reasoning" else "msg")
            first = reasoning_item(item_id, "") if kind == "reasoning" else None
            events += self.begin(first or message_item(item_id, "", "in_progress"))
            self.open, self.text = self.items[-1], ""
            if kind == "message":
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                events.append(self.event("content_part.added", **self._where(), part=part))
        self.text += text
        name = "reasoning_text" if kind == "reasoning" else "output_text"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return [*events, self.event(f"{name}.delta", **self._where(), delta=text, **extra)]

    def close(self) -> list[dict]:
        item, index = self.open, len(self.items) - 1
        if item is None:
            return []
        self.open = None
        if item["type"] == "reasoning":
            done = reasoning_item(item["id"], self.text)
            events = [self.event("reasoning_text.done", **self._where(item), text=self.text)]
        else:
            done = message_item(item["id"], self.text)
            part = done["content"][0]
            events = [
                self.event("output_text.done", **self._where(item), text=self.text, logprobs=[]),
                self.event("content_part.done", **self._where(item), part=part),
            ]
        self.items[index] = done
        return [*events, self.event("output_item.done", output_index=index, item=done)]

    def call(self, call: dict) -> list[dict]:
        events = self.close() + self.begin(call_item(call, "in_progress"))
        index, item = len(self.items) - 1, self.items[-1]
        done = {**item, "arguments": call["function"]["arguments"], "status": "completed"}
        self.items[index] = done
        where = {"item_id": item["id"], "output_index": index}
        args = done["arguments"]
        return [
            *events,
            self.event("function_call_arguments.delta", **where, delta=args),
            self.event("function_call_arguments.done", **where, arguments=args, name=done["name"]),
            self.event("output_item.done", output_index=index, item=done),
        ]

    def _where(self, item: dict | None = None) -> dict:
        item = item or self.open
        index = next(i for i, x in enumerate(self.items) if x["id"] == item["id"])
        return {"item_id": item["id"], "output_index": index, "content_index": 0}


async def response_events(
    chunks: AsyncIterator[dict],
    head: dict,
    output: ChatOutput,
    on_done: Callable[[dict, str, list[int], dict], None],
) -> AsyncIterator[dict]:
    """The Responses API's events for one answer streaming in; ``on_done(response, text,
    token_ids, {"rid", "meta_info"})`` once it is complete (to store it)."""
    events, deltas = _Events(), output.deltas()
    text, ids = "", []
    yield events.event("created", response=response_object(head, [], None))
    yield events.event("in_progress", response=response_object(head, [], None))
    async with aclosing(chunks):
        async for chunk in chunks:
            text, ids = text + chunk["text"], ids + list(chunk["token_ids"])
            delta = deltas.step(chunk)
            for kind, key in (("reasoning", "reasoning_content"), ("message", "content")):
                if delta.get(key):
                    for event in events.write(kind, delta[key]):
                        yield event
            for call in delta.get("tool_calls", []):
                for event in events.call(call):
                    yield event
            if chunk["finished"]:
                for event in events.close():
                    yield event
                response = response_object(head, events.items, chunk["meta_info"])
                on_done(response, text, ids, {"rid": chunk["rid"], "meta_info": chunk["meta_info"]})
                kind = "completed" if response["status"] == "completed" else "incomplete"
                yield events.event(kind, response=response)
