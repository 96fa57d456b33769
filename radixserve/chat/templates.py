"""Chats rendered by a tokenizer's chat template, tools and earlier tool calls included; and
role markers taken from the template, so a program can open and close roles one at a time
and still produce exactly the text the template renders for the whole conversation."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from typing import Any

from jinja2 import TemplateError

from radixserve.chat.reasoning_parsers import ReasoningFormat, reasoning_format
from radixserve.chat.tool_parsers import ToolCall, ToolFormat, tool_format

ROLES = ("system", "user", "assistant")
_PROBE_TOOL = {"type": "function", "function": {"name": "radixserve_probe", "parameters": {}}}


def render_chat(
    tokenizer,
    messages: list[dict],
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    tool_format: ToolFormat | None = None,
    **template_kwargs: Any,
) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template (``chat_text``)."""
    text = chat_text(
        tokenizer, messages, add_generation_prompt, tools, tool_format, **template_kwargs
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def continuation_ids(
    tokenizer,
    earlier: list[dict],
    answer: str,
    ended_on: str | None,
    new: list[dict],
    tools: list[dict] | None = None,
    tool_format: ToolFormat | None = None,
    **template_kwargs: Any,
) -> list[int] | None:
    """The token ids that follow an earlier prompt (``earlier`` rendered) and its
    ``answer`` (which ended on the token whose text is ``ended_on``) to ask for the next
    turn: the template's end of the answer's turn, the ``new`` messages and the generation
    prompt. Appended to the earlier ids, the earlier tokens stay exactly as they were (no
    re-tokenization), so the cache holds all of them. None where the template renders the
    earlier turns differently once new ones follow."""

    def text(messages: list[dict]) -> str:
        return chat_text(tokenizer, messages, True, tools, tool_format, **template_kwargs)

    before = text(earlier) + answer
    after = text([*earlier, {"role": "assistant", "content": answer}, *new])
    if not after.startswith(before):
        return None
    rest = after[len(before) :]
    if ended_on and rest.startswith(ended_on):
        rest = rest[len(ended_on) :]
    return tokenizer(rest, add_special_tokens=False)["input_ids"]


def chat_text(
    tokenizer,
    messages: list[dict],
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    tool_format: ToolFormat | None = None,
    **template_kwargs: Any,
) -> str:
    """``messages`` rendered by the tokenizer's chat template. Where the template has no
    tool section, ``tools`` are described in the system message and earlier calls and
    results written as ``tool_format`` has the model write them."""
    native = template_takes_tools(tokenizer)
    if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        if tool_format is None:
            raise ValueError("tools need a tool format")
        messages = tool_messages(messages, tools or [], tool_format, native)
    if native and tools:
        template_kwargs["tools"] = tools
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, **template_kwargs
        )
    except TemplateError as exc:  # a template that refuses a chat (roles out of order, say)
        raise ValueError(f"the chat template refused these messages: {exc}") from None
    return text


@functools.lru_cache(maxsize=8)
def template_takes_tools(tokenizer) -> bool:
    """Whether the chat template renders the tools it is given (asked once a tokenizer)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if "tools" not in template:
        return False
    chat = [{"role": "user", "content": "x"}]
    text = tokenizer.apply_chat_template(chat, tools=[_PROBE_TOOL], tokenize=False)
    return "radixserve_probe" in text


def tool_messages(
    messages: list[dict], tools: list[dict], fmt: ToolFormat, native: bool
) -> list[dict]:
    """OpenAI's messages as the template takes them: with ``native`` (the template has a
    tool section) calls keep their structure, arguments as objects; otherwise the tools'
    description joins the system message, calls become the text the model writes, and
    results become user turns that hand them back."""
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        if native:
            if calls:
                m["tool_calls"] = [
                    {**c, "function": {**c["function"], "arguments": _arguments(c)}} for c in calls
                ]
        elif m["role"] == "tool":
            m = {"role": "user", "content": fmt.response(m.get("content") or "")}
        elif calls:
            written = fmt.write([ToolCall(c["function"]["name"], _text(c)) for c in calls])
            m["content"] = "\n".join(x for x in (m.get("content"), written) if x)
        out.append(m)
    if tools and not native:
        text = fmt.instructions(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def _arguments(call: dict) -> Any:
    """A call's arguments as an object (OpenAI sends them as JSON text)."""
    args = call["function"].get("arguments") or "{}"
    try:
        return json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        return args


def _text(call: dict) -> str:
    args = call["function"].get("arguments") or "{}"
    return args if isinstance(args, str) else json.dumps(args)


_MARK = "\x00radixserve-content\x00"


@dataclass(frozen=True)
class ChatFormat:
    first_prefixes: dict[str, str]  # role -> its opening as the first message (BOS, defaults)
    prefixes: dict[str, str]  # role -> text before its content, after earlier messages
    suffixes: dict[str, str]  # role -> text after its content
    generation_prompt: str  # the assistant opening the template adds to ask for a reply

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ChatFormat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; roles need one")

        def render(messages: list[dict], generation: bool = False) -> str:
            return tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation
            )

        base = [{"role": "system", "content": "S"}]
        base_text = render(base)
        first, prefixes, suffixes = {}, {}, {}
        for role in ROLES:
            first[role], suffixes[role] = render([{"role": role, "content": _MARK}]).split(_MARK)
            full = render([*base, {"role": role, "content": _MARK}])
            if not full.startswith(base_text):
                raise ValueError(f"the chat template re-renders earlier messages for {role!r}")
            prefixes[role] = full[len(base_text) :].split(_MARK)[0]
        asked = [*base, {"role": "user", "content": "U"}]
        generation_prompt = render(asked, generation=True)[len(render(asked)) :]
        return cls(first, prefixes, suffixes, generation_prompt)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ChatFormat:
        return cls(**data)


class ChatTemplating:
    """Chats rendered by the model's template, for an engine (or a cluster's front door)
    that has ``tokenizer`` and ``config`` (an ``EngineConfig``)."""

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **template_kwargs,
    ) -> list[int]:
        """Token ids of ``messages`` (OpenAI's, tool calls and results included) rendered by
        the model's chat template, with ``tools`` (OpenAI's function tools) described;
        ``template_kwargs`` go to the template (``enable_thinking``, say)."""
        fmt = self.tool_format
        return render_chat(
            self.tokenizer, messages, add_generation_prompt, tools, fmt, **template_kwargs
        )

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        """How this model's reasoning is marked (``EngineConfig.reasoning_parser``)."""
        return reasoning_format(self.config.reasoning_parser)

    @functools.cached_property
    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls (``EngineConfig.tool_call_parser``)."""
        template = getattr(self.tokenizer, "chat_template", None)
        return tool_format(self.config.tool_call_parser, template)

    @functools.cached_property
    def chat_format(self) -> ChatFormat:
        """Per-role openings and closings of the chat template, for programs that add roles
        one at a time; ``ValueError`` when the template cannot be taken apart that way."""
        return ChatFormat.from_tokenizer(self.tokenizer)
