"""SmolLM2-135M-Instruct from its GGUF file against transformers loading the same file:
greedy tokens, the log-likelihood of a paragraph, the chat template, and the engine's
options that must not change outputs (prefix cache, mixed steps)."""

import pytest
import torch

from radixserve import Engine, SamplingParams
from radixserve.model.quantized_model import quantized_modules
from tests.real_model import REAL_MODEL, chat_ids, gguf_tokenizer_oracle, real_model_file

__all__ = ["gguf_tokenizer_oracle", "real_model_file"]  # fixtures

PARAGRAPH = (
    "The library opens at nine in the morning. Students arrive early to find a quiet table "
    "near the windows, where the light is best for reading. By noon the reading room is full, "
    "and the librarians walk between the shelves returning books to their places."
)
PLAIN = ["The three primary colours are", "def fibonacci(n):\n    "]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a patient teacher of science."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [{"role": "user", "content": "Write a short poem about the sea."}],
]


@pytest.fixture(scope="module")
def hf_model(real_model_file):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        real_model_file.parent, gguf_file=real_model_file.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def engine(real_model_file):
    with Engine(REAL_MODEL, dtype="float32") as engine:
        yield engine


def prompts(engine) -> list[list[int]]:
    plain = [engine.tokenizer(text)["input_ids"] for text in PLAIN]
    return plain + [engine.apply_chat_template(m) for m in CHATS]


def hf_greedy(hf_model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=2, top_k=None
        )
    return out[0, len(ids) :].tolist()


def test_greedy_tokens_equal_transformers_on_the_same_file(engine, hf_model):
    batch = prompts(engine)
    params = SamplingParams(max_new_tokens=48, temperature=0)
    ours = engine.generate(input_ids=batch, sampling_params=params)
    for ids, out in zip(batch, ours, strict=True):
        assert out["token_ids"] == hf_greedy(hf_model, ids, 48)
    assert sum(len(o["token_ids"]) for o in ours) > 100  # real continuations, not early stops


def test_the_weights_say_what_the_file_stored_and_what_is_served(engine):
    weights = engine.weights
    assert weights["dtype"] == "float32"  # of the norms; the projections stay as the file has them
    assert weights["file_formats"] == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    assert weights["quantized"] == {"Q4_1": 210, "Q8_0": 1}
    model = engine.runner.loaded.model
    floats = sum(p.numel() * 4 for p in model.parameters())
    codes = sum(m.quant.nbytes for m in quantized_modules(model).values())
    assert weights["bytes"] == floats + codes
    # GGUF's float16 scales and offsets stay float16: served within 1.15x the file's bytes
    assert weights["file_bytes"] == 96_576_768
    assert weights["bytes"] <= 1.15 * weights["file_bytes"]


def test_the_capital_of_france(engine):
    ids = engine.apply_chat_template(CHATS[0])
    out = engine.generate(
        input_ids=ids, sampling_params=SamplingParams(max_new_tokens=20, temperature=0)
    )
    assert out["text"].strip() == "The capital of France is Paris."


def test_log_likelihood_of_a_paragraph_equals_transformers(engine, hf_model):
    ids = engine.tokenizer(PARAGRAPH)["input_ids"]
    params = SamplingParams(max_new_tokens=1, return_logprob=True, logprob_start_len=0)
    ours = engine.generate(input_ids=ids, sampling_params=params)["meta_info"]
    ours = torch.tensor([lp for lp, _ in ours["input_token_logprobs"][1:]], dtype=torch.float64)
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0, :-1].double()
    theirs = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert len(ours) == len(ids) - 1 > 40
    assert (ours - theirs).abs().max().item() < 1e-4


def test_the_chat_template_is_the_files(engine, gguf_tokenizer_oracle):
    for messages in CHATS:
        assert engine.apply_chat_template(messages) == chat_ids(gguf_tokenizer_oracle, messages)


def _two_waves(**options) -> list[list[int]]:
    """Two turns of four users under one system prompt: the second turn can hit the cache."""
    system = {"role": "system", "content": "You answer questions about astronomy in detail."}
    questions = [
        "What is a comet?",
        "How far is the Moon?",
        "What is a star?",
        "Why do planets orbit?",
    ]
    outs = []
    with Engine(REAL_MODEL, dtype="float32", **options) as engine:
        histories = [[system, {"role": "user", "content": q}] for q in questions]
        for turn in range(2):
            batch = [engine.apply_chat_template(h) for h in histories]
            params = SamplingParams(max_new_tokens=24, temperature=0)
            for history, out in zip(
                histories, engine.generate(input_ids=batch, sampling_params=params), strict=True
            ):
                outs.append(out["token_ids"])
                history += [
                    {"role": "assistant", "content": out["text"]},
                    {"role": "user", "content": "Tell me more."},
                ]
            if turn == 1 and options.get("enable_prefix_cache", True):
                assert engine.cache_stats()["hit_tokens"] > 0
    return outs


def test_cache_and_mixed_steps_do_not_change_outputs():
    reference = _two_waves()
    assert _two_waves(enable_prefix_cache=False) == reference
    assert _two_waves(mixed_batches=False) == reference
