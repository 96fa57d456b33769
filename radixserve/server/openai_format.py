"""Engine outputs in the shapes of the OpenAI API: choices, stream chunks, usage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixserve.server.chat_output import ChatOutput

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def finish_reason(meta: dict) -> str | None:
    kind = meta["finish_reason"]["type"]
    return _FINISH.get(kind, "error") if kind else None


def usage(outs: list[dict], n: int) -> dict:
    """Prompt tokens once per prompt (its n samples share it), completion tokens for all."""
    metas = [o["meta_info"] for o in outs]
    groups = [metas[i : i + n] for i in range(0, len(metas), n)]
    prompt = sum(g[0]["prompt_tokens"] for g in groups)
    completion = sum(m["completion_tokens"] for m in metas)
    cached = sum(max(m["cached_tokens"] for m in g) for g in groups)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _token(tok, token_id: int) -> str:
    return tok.decode([token_id])


def completion_logprobs(tok, got: dict) -> dict:
    """The legacy ``logprobs`` object of the tokens in ``got`` (a request's ``meta_info`` or
    a stream chunk): the prompt's first when they are there (an echo; the first prompt
    token has no context, so no logprob), then the generated ones."""
    pairs = got.get("input_token_logprobs", []) + got.get("output_token_logprobs", [])
    prompt_tops = [alts or [] for alts in got.get("input_top_logprobs", [])]
    tops = prompt_tops + got.get("output_top_logprobs", [])
    return {
        "tokens": [_token(tok, t) for _, t in pairs],
        "token_logprobs": [lp for lp, _ in pairs],
        "top_logprobs": [{_token(tok, t): lp for lp, t in alts} or None for alts in tops] or None,
    }


def chat_logprobs(tok, got: dict) -> dict:
    """The chat ``logprobs`` object of the generated tokens in ``got`` (a request's
    ``meta_info`` or a stream chunk)."""
    pairs = got.get("output_token_logprobs", [])
    tops = got.get("output_top_logprobs") or [[]] * len(pairs)
    return {
        "content": [
            {
                "token": _token(tok, t),
                "logprob": lp,
                "bytes": None,
                "top_logprobs": [
                    {"token": _token(tok, a), "logprob": alp, "bytes": None} for alp, a in alts
                ],
            }
            for (lp, t), alts in zip(pairs, tops, strict=True)
        ]
    }


def completion_choice(index: int, out: dict, tok, logprobs: bool, echo: str | None) -> dict:
    """``echo``: the prompt's text, which the choice then opens with (its tokens' logprobs
    come with the output's when the engine was asked for them)."""
    meta = out["meta_info"]
    return {
        "index": index,
        "text": out["text"] if echo is None else echo + out["text"],
        "logprobs": completion_logprobs(tok, meta) if logprobs else None,
        "finish_reason": finish_reason(meta),
    }


def chat_choice(index: int, out: dict, tok, with_logprobs: bool, output: ChatOutput) -> dict:
    """``output``: how the text becomes the message (reasoning, tool calls, content)."""
    meta = out["meta_info"]
    logprobs = chat_logprobs(tok, meta) if with_logprobs else None
    message, called = output.message(out["text"])
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": chat_finish_reason(meta, called),
    }


def chat_finish_reason(meta: dict, called: bool) -> str | None:
    """A chat that stopped after calling tools finished with ``tool_calls``."""
    reason = finish_reason(meta)
    return "tool_calls" if called and reason == "stop" else reason


def completion_chunk(head: dict, index: int, chunk: dict, logprobs: dict | None) -> dict:
    reason = finish_reason(chunk["meta_info"]) if chunk["finished"] else None
    choice: dict[str, Any] = {
        "index": index,
        "text": chunk["text"],
        "logprobs": logprobs,
        "finish_reason": reason,
    }
    return {**head, "choices": [choice]}


def chat_chunk(
    head: dict, index: int, delta: dict, first: bool, reason: str | None, logprobs: dict | None
) -> dict:
    """``delta``: content, reasoning and tool-call deltas (``ChatDeltas.step``); ``logprobs``:
    those of the chunk's tokens."""
    if first:
        delta["role"] = "assistant"
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
    return {**head, "choices": [choice]}
