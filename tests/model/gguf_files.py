"""Write small GGUF files the way llama.cpp's converter does, for the loader's tests.

Tensor names and the Llama q/k row order follow the converter; metadata keys follow the
GGUF spec. Weights come from a transformers model, so the file's expected contents are known.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

PARTS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    stem, _, kind = hf_name.rpartition(".")
    if stem.startswith("model.layers."):
        layer, part = stem.removeprefix("model.layers.").split(".", 1)
        return f"blk.{layer}.{PARTS[part]}.{kind}"
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    return f"{top[stem]}.{kind}"


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """The converter's reordering of Llama's q and k rows (what the loader undoes)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def file_tensors(hf_model, arch: str) -> dict[str, np.ndarray]:
    """``{gguf name: float32 array}`` as the converter would store them."""
    cfg = hf_model.config
    out = {}
    for name, value in hf_model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        array = value.detach().float().numpy()
        if arch == "llama" and name.endswith("q_proj.weight"):
            array = permute_rows(array, cfg.num_attention_heads)
        if arch == "llama" and name.endswith("k_proj.weight"):
            array = permute_rows(array, cfg.num_key_value_heads)
        out[gguf_name(name)] = array
    return out


def write_gguf(
    path: Path,
    arch: str,
    cfg,
    tensors: dict[str, np.ndarray],
    types: dict[str, str] | None = None,
    metadata: dict | None = None,
) -> Path:
    """A GGUF file of ``tensors`` (float32 arrays, or raw blocks for names in ``types``)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    for key, value in (metadata or {}).items():
        writer.add_key_value(key, *value)  # (value, type) or (values, ARRAY, item type)
    for name, array in tensors.items():
        kind = (types or {}).get(name)
        if kind is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, array, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def random_blocks(rows: int, cols: int, kind: str, seed: int = 0) -> np.ndarray:
    """Valid blocks of type ``kind`` with random contents: quantized by the gguf package where
    it can, else random bytes with their float16 scales set to finite values."""
    qtype = gguf.GGMLQuantizationType[kind]
    rng = np.random.default_rng(seed)
    try:
        return gguf.quants.quantize(rng.standard_normal((rows, cols), np.float32), qtype)
    except NotImplementedError:
        pass
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scales = rng.uniform(-0.05, 0.05, (rows, cols // block, 2)).astype(np.float16)
    # Q4_K and Q5_K open with d and dmin; Q6_K ends with d
    at = {"Q4_K": slice(0, 4), "Q5_K": slice(0, 4), "Q6_K": slice(size - 2, size)}[kind]
    raw[:, :, at] = scales.view(np.uint8)[:, :, : at.stop - at.start]
    return raw.reshape(rows, -1)


def dequantized(blocks: np.ndarray, kind: str) -> torch.Tensor:
    return torch.from_numpy(
        gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind]).astype(np.float32)
    )
