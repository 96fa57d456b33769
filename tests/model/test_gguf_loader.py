"""GGUF files written from known weights: the loader yields exactly those weights (and the
gguf package's dequantization of quantized blocks), and refuses damaged or unsupported files
with an error naming what and where, before it allocates any weight."""

import gguf
import numpy as np
import pytest
import torch

from radixserve.model import load_model
from radixserve.model.gguf_loader import GGUFError, _our_name, read_gguf
from radixserve.model.quantized_model import quantized_modules
from radixserve.model.rope import rope_frequencies

from .conftest import save_hf_model
from .gguf_files import dequantized, file_tensors, random_blocks, write_gguf


def assert_same_weights(ours: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    params = dict(ours.named_parameters())
    for name, value in expected.items():
        if name == "lm_head.weight" and "lm_head.weight" not in params:
            continue
        assert torch.equal(params[name].detach(), value), name


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_float32_file_loads_the_checkpoints_exact_weights(hf_models, tmp_path, arch):
    hf, _ = hf_models[arch]
    path = write_gguf(tmp_path / "m.gguf", arch, hf.config, file_tensors(hf, arch))
    loaded = load_model(path)
    cfg = loaded.config
    assert cfg.architecture == hf.config.architectures[0]
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert cfg.qkv_bias == (arch == "qwen2") and cfg.qk_norm == (arch == "qwen3")
    assert cfg.rms_norm_eps == pytest.approx(hf.config.rms_norm_eps)
    assert_same_weights(loaded.model, hf.state_dict())


@pytest.mark.parametrize(
    "kind", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
)
def test_quantized_tensors_equal_the_gguf_packages_dequantization(tmp_path, kind):
    hf = save_hf_model(
        tmp_path / "hf", "qwen2", hidden_size=256, intermediate_size=512, head_dim=64
    )
    tensors = file_tensors(hf, "qwen2")
    types, expected = {}, {}
    for i, name in enumerate(tensors):
        if name.endswith(".weight") and tensors[name].ndim == 2:
            rows, cols = tensors[name].shape
            tensors[name] = random_blocks(rows, cols, kind, seed=i)
            types[name] = kind
            expected[name] = dequantized(tensors[name], kind)
    path = write_gguf(tmp_path / "q.gguf", "qwen2", hf.config, tensors, types)
    widened = dict(load_model(path, quantize="none").model.named_parameters())
    served = load_model(path)  # quantized formats kept as they are
    quantized = quantized_modules(served.model)
    params = dict(served.model.named_parameters())
    for name, values in expected.items():
        ours = _our_name(name)
        assert torch.equal(widened[ours].detach(), values), name
        module = ours.removesuffix(".weight")
        if kind in ("F16", "BF16"):
            assert torch.equal(params[ours].detach(), values) and module not in quantized
        else:
            assert quantized[module].quant.source == kind
            assert torch.equal(quantized[module].quant.dequantize(native=False), values), name


@pytest.fixture
def good_file(hf_models, tmp_path):
    hf, _ = hf_models["llama"]
    return write_gguf(tmp_path / "m.gguf", "llama", hf.config, file_tensors(hf, "llama")), hf


@pytest.fixture
def no_allocation(monkeypatch):
    """Fails the test if the loader gets as far as building the model."""

    def refuse(*args, **kwargs):
        raise AssertionError("weights were allocated for a file that should be refused")

    monkeypatch.setattr("radixserve.model.loader.build_model", refuse)


def test_a_damaged_header_is_refused(good_file, no_allocation):
    path, _ = good_file
    data = bytearray(path.read_bytes())
    data[0:4] = b"GGUX"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="not a readable GGUF file"):
        load_model(path)
    data[0:4] = b"GGUF"
    data[16:24] = (2**62).to_bytes(8, "little")  # an absurd count of metadata entries
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=str(path)):
        load_model(path)


def test_truncated_tensor_data_is_refused_naming_the_tensor(good_file, no_allocation):
    path, _ = good_file
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(GGUFError, match=r"tensor '.+'.*truncated"):
        load_model(path)


def test_an_unsupported_architecture_is_refused(hf_models, tmp_path, no_allocation):
    hf, _ = hf_models["llama"]
    path = write_gguf(tmp_path / "g.gguf", "gpt2", hf.config, file_tensors(hf, "llama"))
    with pytest.raises(GGUFError, match="architecture 'gpt2' is not supported"):
        load_model(path)


def test_an_unsupported_tensor_type_is_refused(hf_models, tmp_path, no_allocation):
    hf = save_hf_model(tmp_path / "hf", "llama", hidden_size=256, intermediate_size=512)
    tensors = file_tensors(hf, "llama")
    name = "blk.0.ffn_up.weight"
    raw = np.zeros((512, 256 // 256 * gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q2_K][1]))
    tensors[name] = raw.astype(np.uint8)
    path = write_gguf(tmp_path / "q2.gguf", "llama", hf.config, tensors, {name: "Q2_K"})
    with pytest.raises(GGUFError, match=r"'blk\.0\.ffn_up\.weight' has type Q2_K"):
        load_model(path)


def test_a_tensor_of_the_wrong_shape_is_refused(hf_models, tmp_path, no_allocation):
    hf, _ = hf_models["llama"]
    tensors = file_tensors(hf, "llama")
    tensors["blk.1.ffn_down.weight"] = tensors["blk.1.ffn_down.weight"][:, :64].copy()
    path = write_gguf(tmp_path / "s.gguf", "llama", hf.config, tensors)
    with pytest.raises(GGUFError, match=r"'blk\.1\.ffn_down\.weight' has shape \(64, 64\)"):
        read_gguf(path)


def test_metadata_reads_as_the_gguf_packages_reader_reads_it(hf_models, tmp_path):
    """The loader's reader takes arrays in a few views; what it reads must not change."""
    from gguf import GGUFReader, GGUFValueType

    from radixserve.model.gguf_loader import _CheckedReader

    hf, _ = hf_models["llama"]
    extra = {
        "tokenizer.ggml.tokens": (["a", "", "héllo", "<|im_end|>"], GGUFValueType.ARRAY),
        "tokenizer.ggml.token_type": ([1, 1, 3, 3], GGUFValueType.ARRAY, GGUFValueType.INT32),
        "test.scores": ([0.5, -1.25], GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
        "test.nested": ([[1, 2], [3]], GGUFValueType.ARRAY),
    }
    tensors = file_tensors(hf, "llama")
    path = write_gguf(tmp_path / "t.gguf", "llama", hf.config, tensors, metadata=extra)
    ours, theirs = _CheckedReader(path), GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        assert ours.fields[key].contents() == field.contents(), key
    assert ours.data_offset == theirs.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]


def test_rope_scaling_is_read_from_the_metadata(hf_models, tmp_path):
    hf, _ = hf_models["llama"]
    extra = {
        "llama.rope.scaling.type": ("linear", gguf.GGUFValueType.STRING),
        "llama.rope.scaling.factor": (4.0, gguf.GGUFValueType.FLOAT32),
    }
    path = write_gguf(
        tmp_path / "r.gguf", "llama", hf.config, file_tensors(hf, "llama"), None, extra
    )
    inv_freq, _ = rope_frequencies(read_gguf(path).hf_config, 16)
    base = 1.0 / (hf.config.rope_parameters["rope_theta"] ** (torch.arange(0, 16, 2) / 16))
    torch.testing.assert_close(inv_freq, base / 4)


def test_llama3_frequency_factors_reproduce_transformers_llama3_rope():
    """GGUF stores llama 3's scaling as per-dimension divisors (``rope_freqs``)."""
    from transformers import LlamaConfig

    llama3 = LlamaConfig(
        head_dim=64,
        num_attention_heads=4,
        hidden_size=256,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    expected, _ = rope_frequencies(llama3, 64)
    plain = LlamaConfig(head_dim=64, num_attention_heads=4, hidden_size=256, rope_theta=500000.0)
    default, _ = rope_frequencies(plain, 64)
    plain.rope_freq_factors = (default / expected).tolist()
    torch.testing.assert_close(rope_frequencies(plain, 64)[0], expected)
