"""The real model the tests run on: SmolLM2-135M-Instruct's GGUF, pulled once per machine
into radixserve's cache (a test that needs it fails when it cannot be pulled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixserve.model.pull import pull

REAL_MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def real_model_file() -> Path:
    return pull(REAL_MODEL)


@pytest.fixture(scope="session")
def gguf_tokenizer_oracle(real_model_file):
    """transformers' own conversion of the file's tokenizer, not our cached copy."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_model_file.parent, gguf_file=real_model_file.name)


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)
