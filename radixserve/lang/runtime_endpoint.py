"""A program backend that talks to ``radixserve serve`` over HTTP: tokenization and the chat
format come from the server, calls go to the native ``/generate`` with token ids."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence

import httpx

from radixserve.chat.tool_parsers import TOOL_FORMATS, ToolFormat
from radixserve.engine import ChatFormat, SamplingParams
from radixserve.lang.backend import BaseBackend, OnText, StreamCollector, scoring_params

_PARAM_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)} - {
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
}


class RuntimeEndpoint(BaseBackend):
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self.info = self._call("GET", "/server_info")

    def _call(self, method: str, path: str, body: dict | None = None) -> dict | list:
        resp = self.client.request(method, path, json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"{self.url}{path}: HTTP {resp.status_code}: {_message(resp)}")
        return resp.json()

    @functools.cached_property
    def chat_format(self) -> ChatFormat:
        data = self.info.get("chat_format")
        if data is None:
            raise ValueError(f"the model served at {self.url} has no chat template")
        return ChatFormat.from_dict(data)

    @property
    def tool_format(self) -> ToolFormat:
        return TOOL_FORMATS[self.info["tool_format"]]

    def tokenize(self, text: str) -> list[int]:
        return self._call("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})[
            "tokens"
        ]

    def _body(self, input_ids, params: SamplingParams, **extra) -> dict:
        sampling = {k: v for k, v in dataclasses.asdict(params).items() if k in _PARAM_FIELDS}
        return {"input_ids": input_ids, "sampling_params": sampling, **extra}

    def generate(
        self, input_ids: Sequence[int], params: SamplingParams, on_text: OnText | None = None
    ) -> dict:
        body = self._body(list(input_ids), params)
        if on_text is None:
            return self._call("POST", "/generate", body)
        collect = StreamCollector(on_text)
        with self.client.stream("POST", "/generate", json={**body, "stream": True}) as resp:
            if resp.status_code != 200:
                resp.read()
                raise RuntimeError(
                    f"{self.url}/generate: HTTP {resp.status_code}: {_message(resp)}"
                )
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"{self.url}/generate: {chunk['error']['message']}")
                if (out := collect(chunk)) is not None:
                    return out
        raise RuntimeError(f"{self.url}/generate: the stream ended without a final chunk")

    def score(self, context_ids: Sequence[int], choices: Sequence[Sequence[int]]) -> list[dict]:
        params = scoring_params(len(context_ids))
        prompts = [[*context_ids, *c] for c in choices]
        body = self._body(
            prompts,
            SamplingParams(max_new_tokens=params.max_new_tokens, temperature=0),
            return_logprob=True,
            logprob_start_len=params.logprob_start_len,
        )
        return self._call("POST", "/generate", body)

    def close(self) -> None:
        self.client.close()


def _message(resp: httpx.Response) -> str:
    try:
        return resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return resp.text[:300]
