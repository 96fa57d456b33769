"""Our decoder over the paged KV pool against Hugging Face transformers on the same weights."""

import numpy as np
import pytest
import torch

from radixserve.cpu import onednn
from radixserve.cpu.native import native_available
from radixserve.model import load_model

from .conftest import ARCHS, save_hf_model
from .paged import PagedRunner, hf_greedy
from .profiles import with_paths

ATOL = 1e-4


def prompt(n: int, seed: int = 0, vocab: int = 320) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def hf_last_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].float()


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    err = (ours - theirs).abs().max().item()
    assert err < ATOL, f"max abs logit error {err:.2e}"


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("page_size", [1, 16])
def test_prefill_matches(hf_models, arch, page_size):
    hf, path = hf_models[arch]
    runner = PagedRunner(load_model(path), page_size)
    ids = prompt(45, seed=1)
    logits = runner.extend([(runner.new(), ids)], all_logits=True)
    assert_close(logits.last[0], hf_last_logits(hf, ids))
    with torch.no_grad():
        every = hf(torch.tensor([ids])).logits[0].float()
    assert_close(logits.all, every)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("page_size", [1, 16])
def test_cached_prefix_then_extend_matches(hf_models, arch, page_size):
    hf, path = hf_models[arch]
    runner = PagedRunner(load_model(path), page_size)
    ids = prompt(70, seed=2)
    expected = hf_last_logits(hf, ids)
    for split in (1, 16, 17, 48, 69):
        seq = runner.new()
        runner.extend([(seq, ids[:split])])
        assert_close(runner.extend([(seq, ids[split:])]).last[0], expected)


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_second_request_reuses_another_requests_prefix(hf_models, page_size):
    hf, path = hf_models["llama"]
    runner = PagedRunner(load_model(path), page_size)
    shared = prompt(32, seed=3)
    first = runner.new()
    runner.extend([(first, [*shared, *prompt(9, seed=4)])])
    tail = prompt(11, seed=5)
    second = first.fork(32)  # the tree would hand out these slots
    logits = runner.extend([(second, tail)]).last[0]
    assert_close(logits, hf_last_logits(hf, shared + tail))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_decode_matches_generate(hf_models, arch):
    hf, path = hf_models[arch]
    runner = PagedRunner(load_model(path), page_size=16)
    ids = prompt(20, seed=6)
    ours = runner.greedy(runner.new(), ids, steps=32)
    assert ours == hf_greedy(hf, ids, 32)


@pytest.mark.parametrize("page_size", [1, 16])
def test_mixed_batch_of_modes_and_lengths(hf_models, page_size):
    hf, path = hf_models["qwen2"]
    runner = PagedRunner(load_model(path), page_size)
    decoding, extending, fresh = runner.new(), runner.new(), runner.new()
    a, b, c = prompt(23, seed=7), prompt(40, seed=8), prompt(5, seed=9)
    runner.extend([(decoding, a)])
    runner.extend([(extending, b[:16])])
    logits = runner.extend([(decoding, [17]), (extending, b[16:]), (fresh, c)]).last
    assert logits.shape[0] == 3
    assert_close(logits[0], hf_last_logits(hf, [*a, 17]))
    assert_close(logits[1], hf_last_logits(hf, b))
    assert_close(logits[2], hf_last_logits(hf, c))


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    ],
    ids=lambda s: s["rope_type"],
)
def test_rope_scaling_types(tmp_path, scaling):
    hf = save_hf_model(tmp_path, "llama", seed=1, rope_scaling=scaling, rope_theta=10000.0)
    runner = PagedRunner(load_model(tmp_path), page_size=16)
    ids = prompt(150, seed=10)
    seq = runner.new()
    runner.extend([(seq, ids[:96])])
    assert_close(runner.extend([(seq, ids[96:])]).last[0], hf_last_logits(hf, ids))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_stays_close(hf_models, dtype):
    hf, path = hf_models["llama"]
    runner = PagedRunner(load_model(path, dtype=dtype), page_size=16)
    ids = prompt(30, seed=11)
    ours = runner.extend([(runner.new(), ids)]).last[0]
    theirs = hf_last_logits(hf, ids)
    assert ours.dtype == torch.float32
    assert (ours - theirs).abs().max().item() < 0.05


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # tied and untied output weights
def test_weights_packed_for_onednn_give_the_same_logits(hf_models, arch):
    from radixserve.cpu import linear

    # float32 packs only where oneDNN outruns torch's BLAS; test its path wherever it exists
    if not onednn.available():
        pytest.skip("torch has no oneDNN here")
    hf, path = hf_models[arch]
    loaded = load_model(path)
    model = loaded.model
    assert model.use_cpu_profile(with_paths(torch.float32, onednn_rows=24)) > 0
    linears = [m for m in model.modules() if isinstance(m, linear.Linear)]
    assert linears and all(m.packed is not None for m in linears)
    # q/k/v and gate/up: fused, with panels for few rows where the native kernels build
    fused = [f for layer in model.model.layers for f in (layer.self_attn.qkv, layer.mlp.gate_up)]
    assert all(f is not None and (f.packed is not None) == native_available() for f in fused)
    assert (model.output_packed is not None) == (arch == "llama")  # qwen2's is a Linear
    runner = PagedRunner(loaded, 16)
    ids = prompt(45, seed=3)  # past onednn_rows: projections and logits run packed
    logits = runner.extend([(runner.new(), ids)], all_logits=True)
    with torch.no_grad():
        every = hf(torch.tensor([ids])).logits[0].float()
    assert_close(logits.all, every)
