"""Role markers taken from a tokenizer's chat template, so a program can open and close
roles one at a time and still produce exactly the text the template renders for the whole
conversation."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ROLES = ("system", "user", "assistant")


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template."""
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


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
