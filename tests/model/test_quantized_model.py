"""The real model served from its quantized weights against the same weights widened to
float32 (the file is the reference, not the float checkpoint it was made from): greedy
continuations and a paragraph's log-likelihood. ``--quantize int8|int4`` against a float
model holding the very values the quantization gave."""

import pytest

from radixserve import Engine, SamplingParams
from radixserve.cpu.linear import Linear
from radixserve.cpu.quant_linear import QuantizedLinear
from radixserve.model import load_model
from radixserve.model.quantized_model import quantize_model
from tests.real_model import REAL_MODEL, real_model_file

from .paged import PagedRunner
from .test_real_model import PARAGRAPH

__all__ = ["real_model_file"]  # a fixture

TOPICS = ["the sea", "a library", "bread", "trains", "winter", "a garden", "chess", "rain"]
PROMPTS = [f"Write two sentences about {t}." for t in TOPICS] + [
    "The three primary colours are",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "The capital of Japan is",
    "To make a cup of tea, first",
    "import numpy as np\n\n",
    "The planets of the solar system are",
    "My favourite book is",
]


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions where two sets of continuations hold the same token."""
    same = sum(x == y for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))
    return same / sum(len(p) for p in a)


@pytest.fixture(scope="module")
def engines(real_model_file):
    with Engine(REAL_MODEL) as quantized, Engine(REAL_MODEL, quantize="none") as widened:
        yield quantized, widened


def test_the_file_is_served_quantized_by_default(engines):
    quantized, widened = engines
    q, w = quantized.weights, widened.weights
    assert q["quantized"] == {"Q4_1": 210, "Q8_0": 1} and w["quantized"] == {}
    assert q["file_formats"] == w["file_formats"]
    assert q["bytes"] < w["bytes"] / 4  # codes and group scales, not float32


def test_greedy_continuations_agree_with_the_widened_weights(engines):
    quantized, widened = engines
    params = SamplingParams(max_new_tokens=48, temperature=0, ignore_eos=True)
    ids = [quantized.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    ours = [o["token_ids"] for o in quantized.generate(input_ids=ids, sampling_params=params)]
    ref = [o["token_ids"] for o in widened.generate(input_ids=ids, sampling_params=params)]
    assert len(ours) == 16 and all(len(o) == 48 for o in ours)
    assert agreement(ours, ref) >= 0.95


def test_a_paragraphs_log_likelihood_is_within_one_percent(engines):
    params = SamplingParams(max_new_tokens=1, return_logprob=True, logprob_start_len=0)
    totals = []
    for engine in engines:
        ids = engine.tokenizer(PARAGRAPH)["input_ids"]
        meta = engine.generate(input_ids=ids, sampling_params=params)["meta_info"]
        totals.append(sum(lp for lp, _ in meta["input_token_logprobs"][1:]))
    quantized, widened = totals
    assert widened < -50  # a real sum over the paragraph
    assert abs(quantized - widened) <= 0.01 * abs(widened)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantize_at_load_agrees_with_the_float_model_of_its_values(real_model_file, kind):
    """The float weights quantized as ``--quantize`` does, against a float model given the
    very values the codes stand for."""
    quantized = load_model(REAL_MODEL, quantize="none")
    assert quantize_model(quantized.model, kind) == 30 * 7
    reference = load_model(REAL_MODEL, quantize="none")
    for name, module in quantized.model.named_modules():
        if isinstance(module, QuantizedLinear):
            target = reference.model.get_submodule(name)
            assert isinstance(target, Linear)
            target.weight.data.copy_(module.quant.dequantize(native=False))
    a, b = PagedRunner(quantized), PagedRunner(reference)
    ids = [quantized.tokenizer(p)["input_ids"] for p in PROMPTS[8:12]]
    ours = [a.greedy(a.new(), p, 24) for p in ids]
    ref = [b.greedy(b.new(), p, 24) for p in ids]
    assert agreement(ours, ref) >= 0.95


def test_an_engine_quantizes_a_float_model_at_load():
    with Engine("tiny", quantize="int4") as engine:
        assert engine.weights["quantized"] == {"int4": engine.runner.loaded.config.num_layers * 7}
        out = engine.generate("hello", SamplingParams(max_new_tokens=8, temperature=0))
        assert len(out["token_ids"]) == 8
    with pytest.raises(ValueError, match="quantize must be one of"):
        Engine("tiny", quantize="int3")
