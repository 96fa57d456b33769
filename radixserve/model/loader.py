"""Load a model (a preset, a Hugging Face checkpoint, a GGUF file) into our decoder.

Tensors stream from ``safetensors`` files one at a time into the model's own storage, so the
checkpoint is never held twice in memory.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from radixserve.model.build import LoadedModel, build_model
from radixserve.model.config import ModelConfig
from radixserve.model.gguf_loader import (
    gguf_tokenizer,
    load_gguf_weights,
    quantized_tensor,
    read_gguf,
)
from radixserve.model.llama import LlamaForCausalLM
from radixserve.model.presets import load_preset, preset_hf_config, preset_tokenizer
from radixserve.model.pull import radixserve_home
from radixserve.model.quantized import FORMATS, QUANTIZE_KINDS
from radixserve.model.quantized_model import (
    check_quantize,
    quantize_model,
    stays_quantized,
    to_matrix,
)
from radixserve.model.sources import resolve_model

# Buffers some checkpoints carry that we recompute.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_model(
    spec: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    quantize: str = "auto",
) -> LoadedModel:
    """Load what ``spec`` names (``radixserve.model.sources``): a preset, a named model, a
    GGUF file, a Hugging Face directory or model id. ``quantize``: which weights stay or
    become quantized (``model.quantized_model``)."""
    check_quantize(quantize, device)
    source = resolve_model(spec)
    if source.kind == "preset":
        loaded = load_preset(source.name, dtype=dtype, device=device)
    elif source.kind == "gguf":
        loaded = load_gguf(source.path, dtype, device, quantize)
    else:
        from transformers import AutoConfig, AutoTokenizer

        path = source.path
        hf_config = AutoConfig.from_pretrained(path)
        model = build_model(hf_config, dtype, device)
        load_weights(model, path)
        tokenizer = AutoTokenizer.from_pretrained(path) if _has_tokenizer(path) else None
        eos = eos_token_ids(path, hf_config)
        loaded = LoadedModel(model, model.config, hf_config, tokenizer, eos)
    if quantize in QUANTIZE_KINDS:
        quantize_model(loaded.model, quantize)
    return loaded


def load_gguf(
    path: Path, dtype: torch.dtype, device: torch.device | str, quantize: str = "auto"
) -> LoadedModel:
    """A GGUF file, checked whole before any weight is allocated; its quantized tensors
    kept so where ``quantize`` says, the others in ``dtype``."""
    ckpt = read_gguf(path)
    tokenizer = gguf_tokenizer(ckpt, radixserve_home() / "tokenizers")
    quantized = {
        name: to_matrix(quantized_tensor(ckpt, name))
        for name, t in ckpt.tensors.items()
        if t.tensor_type in FORMATS and stays_quantized(name, quantize, device)
    }
    model = build_model(ckpt.hf_config, dtype, device, quantized)
    load_gguf_weights(model, ckpt, skip=set(quantized))
    formats = Counter(t.tensor_type.name for t in ckpt.tensors.values())
    file_bytes = sum(int(t.n_bytes) for t in ckpt.tensors.values())
    return LoadedModel(
        model,
        model.config,
        ckpt.hf_config,
        tokenizer,
        ckpt.eos_token_ids,
        dict(formats),
        file_bytes,
    )


def load_model_config(spec: str | Path) -> ModelConfig:
    """Only the shape of what ``spec`` names (no weights)."""

    source = resolve_model(spec)
    if source.kind == "preset":
        return ModelConfig.from_hf(preset_hf_config(source.name))
    if source.kind == "gguf":
        return ModelConfig.from_hf(read_gguf(source.path).hf_config)
    from transformers import AutoConfig

    return ModelConfig.from_hf(AutoConfig.from_pretrained(source.path))


def load_tokenizer(spec: str | Path) -> Any:
    """Only the tokenizer of what ``spec`` names (None if it has none)."""

    source = resolve_model(spec)
    if source.kind == "preset":
        return preset_tokenizer(source.name)
    if source.kind == "gguf":
        return gguf_tokenizer(read_gguf(source.path), radixserve_home() / "tokenizers")
    if not _has_tokenizer(source.path):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.path)


def load_weights(model: LlamaForCausalLM, path: Path) -> None:
    """Copy every tensor of the checkpoint at ``path`` into ``model``, by name."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file in checkpoint_files(path):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                if name == "lm_head.weight" and model.config.tie_word_embeddings:
                    continue
                if name not in params:
                    raise ValueError(f"{file.name}: unexpected tensor {name!r}")
                tensor = f.get_tensor(name)
                target = params[name]
                if tensor.shape != target.shape:
                    raise ValueError(
                        f"tensor {name!r} has shape {tuple(tensor.shape)} in the checkpoint, "
                        f"the model expects {tuple(target.shape)}"
                    )
                with torch.no_grad():
                    target.copy_(tensor)
                loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint at {path} lacks {len(missing)} tensors, e.g. {missing[:3]}")


def checkpoint_files(path: Path) -> list[Path]:
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    raise FileNotFoundError(f"{path} holds neither model.safetensors nor a sharded index")


def eos_token_ids(path: Path, hf_config: Any) -> tuple[int, ...]:
    """End-of-sequence ids: the generation config's, else the model config's."""
    eos = None
    gen = path / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
    if eos is None:
        eos = getattr(hf_config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)


def _has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model"))
