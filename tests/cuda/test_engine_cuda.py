"""The engine on CUDA against transformers on the same GPU: float32 greedy output is equal;
in half precision each greedy token is transformers' argmax up to rounding (the logit it
picks is within a small margin of the best one), with the prefix cache hit and fully freed."""

import importlib.util

import pytest
import torch

from radixserve import Engine, SamplingParams
from radixserve.model import export_preset

from ..e2e.engine_runs import workload

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

NEW_TOKENS = 12
GREEDY = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
# Largest gap allowed between transformers' best logit and the one picked; the presets'
# logits spread with a standard deviation of 0.16 (tiny) to 0.48 (bench-135m).
MARGIN = {"float16": 0.02, "bfloat16": 0.06}


@pytest.fixture(scope="module", params=["tiny", "bench-135m"])
def reference(request, tmp_path_factory):
    """The preset's name and transformers' float32 model of it on the GPU."""
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp(request.param)
    export_preset(request.param, path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    return request.param, hf


def generate(preset: str, **options) -> tuple[list[list[int]], dict]:
    with Engine(preset, device="cuda", check_invariants=True, **options) as engine:
        outs = engine.generate(input_ids=workload(), sampling_params=GREEDY)
        stats = engine.cache_stats()
        assert engine.flush_cache()
        assert engine.allocator.num_free == engine.allocator.capacity
    return [o["token_ids"] for o in outs], stats


@pytest.mark.parametrize("page_size", [1, 16])
def test_float32_greedy_equals_transformers(reference, page_size):
    preset, hf = reference
    outs, stats = generate(preset, page_size=page_size, attention_backend="torch")
    with torch.no_grad():
        for ids, out in zip(workload(), outs, strict=True):
            gen = hf.generate(
                torch.tensor([ids], device="cuda"),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
            assert out == gen[0, len(ids) :].tolist()
    assert stats["hit_tokens"] > 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["torch", "flashinfer"])
def test_half_precision_picks_transformers_argmax(reference, backend, dtype):
    if backend == "flashinfer" and importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer is not installed (pip install 'radixserve[cuda]')")
    preset, hf = reference
    outs, stats = generate(preset, page_size=16, attention_backend=backend, dtype=dtype)
    worst = 0.0
    with torch.no_grad():
        for ids, out in zip(workload(), outs, strict=True):
            logits = hf(torch.tensor([ids + out], device="cuda")).logits[0, len(ids) - 1 : -1]
            picked = logits.gather(1, torch.tensor(out, device="cuda")[:, None])[:, 0]
            worst = max(worst, (logits.max(-1).values - picked).max().item())
    print(f"{preset} {backend} {dtype}: worst gap to transformers' argmax {worst:.4f}")
    assert worst <= MARGIN[dtype]
    assert stats["hit_tokens"] > 0


def test_structured_output_masks_logits_on_the_gpu():
    import json

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
    }
    with Engine("tiny", device="cuda", attention_backend="torch") as engine:
        params = [
            SamplingParams(max_new_tokens=32, temperature=1.0, seed=s, json_schema=schema)
            for s in range(8)
        ]
        for out in engine.generate(["Number:"] * 8, params):
            assert 0 <= json.loads(out["text"])["n"] <= 9


def test_host_tier_pages_come_back_through_the_side_stream(tmp_path):
    """Pages evicted to pinned host memory (and pushed down to disk) are copied back layer
    by layer on a side stream; the next forward waits per layer, so outputs equal a run
    with no cache at all."""
    import numpy as np

    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 1000, 200).tolist() for _ in range(3)]
    flood = [rng.integers(3, 1000, 200).tolist() for _ in range(6)]
    with Engine("tiny", device="cuda", enable_prefix_cache=False) as engine:
        expected = [
            o["token_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)
        ]
    options = dict(page_size=16, max_total_tokens=512, host_cache_size_gb=0.001)
    with Engine("tiny", device="cuda", disk_cache_dir=str(tmp_path), **options) as engine:
        engine.generate(input_ids=prompts, sampling_params=GREEDY)
        engine.generate(input_ids=flood, sampling_params=GREEDY)
        again = [engine.generate(input_ids=p, sampling_params=GREEDY) for p in prompts]
        assert engine.tier.buffer.is_pinned()
    assert [o["token_ids"] for o in again] == expected
    tiers = [o["meta_info"]["cached_tokens_by_tier"] for o in again]
    assert all(t["host"] + t["disk"] > 0 for t in tiers)
