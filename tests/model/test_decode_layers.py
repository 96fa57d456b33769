"""A decode step's layers in one native call (``cpu/decode_layers.py``): the same logits and
the same K/V as the layer-by-layer path, bit for bit; greedy decoding through it equals
transformers'; every forward it does not take goes through the layers."""

import numpy as np
import pytest
import torch

from radixserve.attention import ExtendRequest, ForwardBatch, PrefixGroup, create_attention_backend
from radixserve.cpu import decode_layers as decode_module
from radixserve.cpu.native import load_native, native_available
from radixserve.memory import KVSlotAllocator
from radixserve.memory.kv_pool import KVPool
from radixserve.model import load_model
from radixserve.model.presets import load_preset
from radixserve.model.quantized_model import quantize_model

from .paged import PagedRunner, hf_greedy
from .profiles import here

pytestmark = pytest.mark.skipif(not native_available(), reason="native kernels did not build")

DTYPES = [
    torch.float32,
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(
            not native_available() or not load_native().bf16_dot(),
            reason="bfloat16 panels need AVX512_BF16",
        ),
    ),
]


@pytest.fixture
def taken(monkeypatch) -> list[bool]:
    """Whether each forward's decode loop ran (True) or left it to the layers (False)."""
    calls: list[bool] = []
    real = decode_module.DecodeLayers.__call__

    def spy(self, *args):
        out = real(self, *args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(decode_module.DecodeLayers, "__call__", spy)
    return calls


class _Setup:
    def __init__(self, dtype: torch.dtype, page_size: int = 16, quantize: str = "none") -> None:
        loaded = load_preset("tiny", dtype=dtype)
        self.model, cfg = loaded.model, loaded.config
        if quantize != "none":
            quantize_model(self.model, quantize)
        self.model.use_cpu_profile(here())
        self.page_size = page_size
        self.allocator = KVSlotAllocator(4096, page_size)
        self.pool = KVPool(
            cfg.num_layers, 4096, page_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype
        )
        self.backend = create_attention_backend(
            "native", self.pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 0.25, here()
        )

    def forward(self, batch: ForwardBatch, native: bool) -> torch.Tensor:
        loop = self.model.decode_layers
        if not native:
            self.model.decode_layers = None
        try:
            return self.model(batch, self.backend).last
        finally:
            self.model.decode_layers = loop


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("quantize", ["none", "int8", "int4"])
def test_decode_steps_equal_the_layer_by_layer_path(dtype, grouped, quantize, taken):
    """Projections on panels or quantized weights (``--quantize``): the same kernels."""
    s = _Setup(dtype, quantize=quantize)
    assert s.model.decode_layers is not None
    rng = np.random.default_rng(1)
    shared = s.allocator.alloc(64)  # a cached prefix the first three requests read
    s.forward(ForwardBatch.create([ExtendRequest(rng.integers(0, 300, 64), shared)], 16), True)
    lens = [int(n) for n in rng.integers(1, 90, 5)]
    contexts = []
    for i, n in enumerate(lens):
        own = s.allocator.alloc(n + 8)
        slots = np.concatenate([shared, own]) if i < 3 else own
        start = 64 if i < 3 else 0
        request = ExtendRequest(rng.integers(0, 300, n), slots[: start + n])
        s.forward(ForwardBatch.create([request], 16), True)
        contexts.append((slots, start + n))
    groups = [PrefixGroup(64, (0, 1, 2))] if grouped else []
    # two decode steps, then two whose rows verify 2 draft tokens (3 rows a request, each
    # with its logits: speculative decoding)
    for at, k in [(0, 1), (1, 1), (2, 3), (5, 3)]:
        requests = [
            ExtendRequest(rng.integers(0, 300, k), slots[: n + at + k]) for slots, n in contexts
        ]
        counts = None if k == 1 else [k] * len(requests)
        batch = ForwardBatch.create(requests, 16, prefix_groups=groups, logit_lens=counts)
        before = [t.clone() for t in s.pool.k + s.pool.v]
        native = s.forward(batch, native=True)
        assert len(native) == k * len(requests)
        after = [t.clone() for t in s.pool.k + s.pool.v]
        for t, saved in zip(s.pool.k + s.pool.v, before, strict=True):
            t.copy_(saved)
        batch = ForwardBatch.create(requests, 16, prefix_groups=groups, logit_lens=counts)
        layered = s.forward(batch, native=False)
        assert torch.equal(native, layered)
        assert all(torch.equal(a, b) for a, b in zip(after, s.pool.k + s.pool.v, strict=True))
    assert taken == [False] * 6 + [True] * 4  # prefills through the layers, decodes not


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_greedy_decoding_through_the_loop_matches_transformers(hf_models, arch, taken):
    hf, path = hf_models[arch]
    loaded = load_model(path)
    loaded.model.use_cpu_profile(here())
    assert loaded.model.decode_layers is not None
    runner = PagedRunner(loaded, page_size=16, backend="native")
    ids = np.random.default_rng(6).integers(0, 320, 20).tolist()
    ours = runner.greedy(runner.new(), ids, steps=24)
    assert ours == hf_greedy(hf, ids, 24)
    assert taken[0] is False and all(taken[1:]) and len(taken) == 25  # prefill, then decodes


def test_other_forwards_go_through_the_layers(taken):
    s = _Setup(torch.float32)
    rng = np.random.default_rng(2)
    a, b = s.allocator.alloc(40), s.allocator.alloc(40)
    prefill = [ExtendRequest(rng.integers(0, 300, 20), a[:20])]
    s.forward(ForwardBatch.create(prefill, 16), True)
    mixed = [ExtendRequest([7], a[:21]), ExtendRequest(rng.integers(0, 300, 9), b[:9])]
    s.forward(ForwardBatch.create(mixed, 16), True)
    every = ForwardBatch.create([ExtendRequest([7], a[:22])], 16, return_all_logits=True)
    s.forward(every, True)
    copies = (np.array([0]), np.array([30]))  # a cached K/V copied within the pass
    s.forward(ForwardBatch.create([ExtendRequest([7], a[:23])], 16, kv_copies=copies), True)
    assert taken == [False] * 4


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_no_loop_for_biases_or_qk_norms(hf_models, arch):
    loaded = load_model(hf_models[arch][1])
    loaded.model.use_cpu_profile(here())
    assert loaded.model.decode_layers is None


def test_the_torch_backend_attends_layer_by_layer(taken):
    s = _Setup(torch.float32)
    cfg = s.model.config
    s.backend = create_attention_backend(
        "torch", s.pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 0.25
    )
    s.forward(ForwardBatch.create([ExtendRequest([1], s.allocator.alloc(16)[:1])], 16), True)
    assert taken == [False]
