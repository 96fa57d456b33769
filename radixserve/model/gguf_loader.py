"""GGUF files (llama.cpp's format): metadata to a transformers config, tensors to our decoder.

``read_gguf`` checks everything before a weight is allocated: the file parses, the
architecture is one we serve, every tensor has a known name, a supported type, the shape the
metadata implies and lies wholly inside the file. ``load_gguf_weights`` then dequantizes
tensor by tensor with the ``gguf`` package (one vectorised numpy call each) into the
model's dtype. Tokenizer and chat template come from the metadata through transformers'
converter, run once per file and kept (``gguf_tokenizer``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize as gguf_dequantize

from radixserve.model.config import ModelConfig
from radixserve.model.quantized import QuantizedWeight, from_gguf

# GGUF architecture -> the transformers architecture whose decoder ours matches
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED_TYPES = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
)  # fmt: skip
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


class GGUFError(ValueError):
    """A GGUF file we cannot serve; the message names the file and what is wrong."""


@dataclass(frozen=True)
class GGUFCheckpoint:
    path: Path
    architecture: str  # the file's, e.g. "llama"
    hf_config: Any
    tensors: dict[str, Any]  # our parameter name -> the reader's tensor
    eos_token_ids: tuple[int, ...]
    header_sha256: str  # metadata and tensor table: keys the converted tokenizer
    has_tokenizer: bool


def read_gguf(path: str | Path) -> GGUFCheckpoint:
    """Parse and check ``path``; raises ``GGUFError`` naming what is wrong and where."""
    path = Path(path)
    try:
        reader = _CheckedReader(path)
    except GGUFError as exc:
        raise GGUFError(f"{path}: {exc}") from None
    except Exception as exc:  # the reader raises whatever numpy hits on a damaged header
        raise GGUFError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    meta = _Metadata(reader, path)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"{path}: architecture {arch!r} is not supported; radixserve serves "
            f"{', '.join(ARCHITECTURES)}"
        )
    names = {t.name for t in reader.tensors}
    hf = _hf_config(meta, arch, tied="output.weight" not in names)
    tensors, rope_freqs = _map_tensors(reader, path, hf)
    if rope_freqs is not None:  # llama 3's per-dimension divisors of the rope frequencies
        hf.rope_freq_factors = dequantize(rope_freqs).tolist()
    return GGUFCheckpoint(
        path=path,
        architecture=arch,
        hf_config=hf,
        tensors=tensors,
        eos_token_ids=tuple(hf.eos_token_id),
        header_sha256=hashlib.sha256(reader.data[: reader.data_offset]).hexdigest(),
        has_tokenizer="tokenizer.ggml.model" in reader.fields,
    )


class _CheckedReader(GGUFReader):
    """The ``gguf`` package's reader, telling which tensor a truncated file cuts off, and
    reading arrays (a vocabulary, its merges) as a few views rather than three numpy
    arrays an element (which takes seconds for a large vocabulary)."""

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple:
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        item_type = self._get(orig_offs, np.uint32)
        count = self._get(orig_offs + 4, np.uint64)
        offs, kind = orig_offs + 12, GGUFValueType(int(item_type[0]))
        types = [GGUFValueType.ARRAY, kind]
        scalar = self.gguf_scalar_to_np.get(kind)
        if scalar is not None:  # one view of every element; ReaderField.contents flattens it
            values = self._get(offs, scalar, int(count[0]))
            return 12 + int(values.nbytes), [item_type, count, values], [2], types
        if kind != GGUFValueType.STRING:
            return super()._get_field_parts(orig_offs, raw_type)
        raw = memoryview(self.data)
        parts, data = [item_type, count], []
        for _ in range(int(count[0])):
            size = int.from_bytes(raw[offs : offs + 8], "little")
            if offs + 8 + size > len(raw):
                raise ValueError(f"a string array runs past the end of the file at byte {offs:,}")
            parts += (raw[offs : offs + 8], raw[offs + 8 : offs + 8 + size])
            data.append(len(parts) - 1)
            offs += 8 + size
        return offs - orig_offs, parts, data, types

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        for field in fields:
            _, name, _, dims, kind, offset = field.parts
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(kind[0]))]
            end = start_offs + int(offset[0]) + int(np.prod(dims)) * type_size // block
            if end > len(self.data):
                raise GGUFError(
                    f"tensor {bytes(name).decode(errors='replace')!r} ends at byte {end:,} "
                    f"but the file has {len(self.data):,}: the file is truncated"
                )
        super()._build_tensors(start_offs, fields)


class _Metadata:
    def __init__(self, reader: Any, path: Path) -> None:
        self.fields, self.path = reader.fields, path

    def get(self, key: str, default: Any = ...) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is ...:
                raise GGUFError(f"{self.path}: metadata key {key!r} is missing")
            return default
        return field.contents()


def _hf_config(meta: _Metadata, arch: str, tied: bool) -> Any:
    """The transformers config our decoder is built from, filled from the metadata."""
    import transformers

    heads = meta.get(f"{arch}.attention.head_count")
    hidden = meta.get(f"{arch}.embedding_length")
    eos = [meta.get(f"tokenizer.ggml.{kind}_token_id", None) for kind in ("eos", "eot")]
    architecture = ARCHITECTURES[arch]
    config_class = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    hf = config_class(
        vocab_size=meta.get(f"{arch}.vocab_size", None) or len(meta.get("tokenizer.ggml.tokens")),
        hidden_size=hidden,
        intermediate_size=meta.get(f"{arch}.feed_forward_length"),
        num_hidden_layers=meta.get(f"{arch}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=meta.get(f"{arch}.attention.head_count_kv", heads),
        head_dim=meta.get(f"{arch}.attention.key_length", hidden // heads),
        max_position_embeddings=meta.get(f"{arch}.context_length"),
        rms_norm_eps=meta.get(f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
        rope_scaling=_rope_scaling(meta, arch),
        tie_word_embeddings=tied,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id", None),
        eos_token_id=list(dict.fromkeys(i for i in eos if i is not None)),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id", None),
    )
    hf.architectures = [architecture]
    return hf


def _rope_scaling(meta: _Metadata, arch: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind not in ("linear", "yarn"):
        raise GGUFError(f"{meta.path}: rope scaling {kind!r} is not supported (linear, yarn)")
    scaling = {"rope_type": kind, "factor": float(meta.get(f"{arch}.rope.scaling.factor"))}
    if kind == "yarn":
        original = meta.get(f"{arch}.rope.scaling.original_context_length")
        scaling["original_max_position_embeddings"] = original
    return scaling


def _map_tensors(reader: Any, path: Path, hf: Any) -> tuple[dict[str, Any], Any | None]:
    """Our parameter name -> reader tensor, each checked for name, type, shape and extent."""
    from radixserve.model.llama import LlamaForCausalLM

    with torch.device("meta"):
        expected = dict(LlamaForCausalLM(ModelConfig.from_hf(hf), hf).named_parameters())
    out, rope_freqs = {}, None
    for t in reader.tensors:
        where = f"{path}: tensor {t.name!r}"
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise GGUFError(
                f"{where} has type {t.tensor_type.name}, not one of {', '.join(SUPPORTED_TYPES)}"
            )
        if t.name == "rope_freqs.weight":
            rope_freqs = t
            continue
        name = _our_name(t.name)
        if name not in expected:
            raise GGUFError(f"{where} is not part of a {hf.architectures[0]} of this shape")
        shape = tuple(int(d) for d in reversed(t.shape))
        if shape != tuple(expected[name].shape):
            raise GGUFError(
                f"{where} has shape {shape}; the metadata implies {tuple(expected[name].shape)}"
            )
        out[name] = t
    missing = sorted(set(expected) - set(out))
    if missing:
        raise GGUFError(f"{path}: lacks {len(missing)} tensors, e.g. {missing[:3]}")
    return out, rope_freqs


def _our_name(gguf_name: str) -> str:
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES.get(part, part)}.{kind}"
    stem, _, kind = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES.get(stem, stem)}.{kind}"


def dequantize(tensor: Any) -> torch.Tensor:
    """A reader tensor as float32, in our ``[out, in]`` order."""
    values = np.ascontiguousarray(gguf_dequantize(tensor.data, tensor.tensor_type), np.float32)
    if not values.flags.writeable:  # float32 tensors come back as views of the mapped file
        values = values.copy()
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return torch.from_numpy(values).reshape(shape)


def load_gguf_weights(
    model: torch.nn.Module, ckpt: GGUFCheckpoint, skip: set[str] = frozenset()
) -> None:
    """Copy every tensor of ``ckpt`` but ``skip`` into ``model`` (built from
    ``ckpt.hf_config``), dequantized to the model's dtype."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in ckpt.tensors.items():
            if name not in skip:
                params[name].copy_(_our_rows(ckpt, name, dequantize(tensor)))


def quantized_tensor(ckpt: GGUFCheckpoint, name: str) -> QuantizedWeight:
    """Tensor ``name`` of ``ckpt`` repacked as it is (``model.quantized``), rows in our order."""
    tensor = ckpt.tensors[name]
    shape = tuple(int(d) for d in reversed(tensor.shape))
    weight = from_gguf(tensor.data, tensor.tensor_type, shape)
    order = _our_rows(ckpt, name, torch.arange(shape[0]).unsqueeze(1)).squeeze(1).numpy()
    if (order == np.arange(shape[0])).all():
        return weight
    offset = None if weight.offset is None else weight.offset[order]
    return dataclasses.replace(
        weight, codes=weight.codes[order], scale=weight.scale[order], offset=offset
    )


def _our_rows(ckpt: GGUFCheckpoint, name: str, values: torch.Tensor) -> torch.Tensor:
    """``values`` (a weight's rows) in our order: llama.cpp's converter interleaves Llama's
    q and k rows for its rope kernel."""
    if ckpt.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
        cfg = ckpt.hf_config
        heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
        return unpermute_rows(values, heads)
    return values


def unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo the converter's per-head row order (pairs ``(i, i + d/2)`` stored side by side)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_tokenizer(ckpt: GGUFCheckpoint, cache_dir: Path) -> Any:
    """The file's tokenizer and chat template as a transformers tokenizer, converted from
    the metadata on first use and kept in ``cache_dir/<header hash>`` after that."""
    from transformers import AutoTokenizer

    saved = cache_dir / ckpt.header_sha256[:24]
    if not ckpt.has_tokenizer:
        return None
    if not (saved / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(ckpt.path.parent, gguf_file=ckpt.path.name)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=cache_dir, prefix=".convert-")
        os.chmod(tmp, 0o755)  # mkdtemp's folder is private; the cache is not
        try:
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, saved)  # whole or not at all
        except OSError:
            if not (saved / "tokenizer.json").is_file():  # not another process's copy
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return AutoTokenizer.from_pretrained(saved)
