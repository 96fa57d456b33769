"""FlashInfer against the torch reference on CUDA; skipped (with the reason) elsewhere."""

import importlib.util

import numpy as np
import pytest
import torch

from radixserve.model import load_model

from ..model.paged import PagedRunner

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(
        importlib.util.find_spec("flashinfer") is None,
        reason="flashinfer is not installed (pip install 'radixserve[cuda]')",
    ),
]


@pytest.mark.parametrize("preset", ["tiny", "bench-135m"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_flashinfer_agrees_with_torch(preset, page_size, dtype):
    loaded = load_model(preset, dtype=getattr(torch, dtype), device="cuda")
    runners = {
        name: PagedRunner(loaded, page_size, num_slots=4096, backend=name, device="cuda")
        for name in ("torch", "flashinfer")
    }
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 1000, n).tolist() for n in (37, 5, 64)]
    logits = {}
    for name, runner in runners.items():
        seqs = [runner.new() for _ in prompts]
        steps = [runner.extend([(s, p[:16]) for s, p in zip(seqs, prompts, strict=True)]).last]
        # A mixed extend over cached prefixes, then three decode-only steps.
        steps.append(
            runner.extend([(s, p[16:] or [1]) for s, p in zip(seqs, prompts, strict=True)]).last
        )
        for token in (7, 8, 9):
            steps.append(runner.extend([(s, [token]) for s in seqs]).last)
        logits[name] = steps
    tolerance = {"float16": 3e-2, "bfloat16": 6e-2}[dtype]
    for ours, ref in zip(logits["flashinfer"], logits["torch"], strict=True):
        assert (ours - ref).abs().max().item() < tolerance
