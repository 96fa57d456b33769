"""Load a Hugging Face checkpoint directory (or a built-in preset) into our decoder.

Tensors stream from ``safetensors`` files one at a time into the model's own storage, so the
checkpoint is never held twice in memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from radixserve.model.config import ModelConfig
from radixserve.model.llama import LlamaForCausalLM

# Buffers some checkpoints carry that we recompute.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    hf_config: Any
    tokenizer: Any
    eos_token_ids: tuple[int, ...]


def build_model(hf_config: Any, dtype: torch.dtype, device: torch.device | str) -> LlamaForCausalLM:
    """An uninitialised model (storage allocated, values arbitrary) of ``hf_config``'s shape."""
    cfg = ModelConfig.from_hf(hf_config)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, hf_config)
    return model.to_empty(device=device).to(dtype).eval()


def load_model(
    path_or_preset: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> LoadedModel:
    """Load a preset name (see ``radixserve.model.presets``) or a local HF directory."""
    from radixserve.model.presets import PRESETS, load_preset

    if str(path_or_preset) in PRESETS:
        return load_preset(str(path_or_preset), dtype=dtype, device=device)
    path = Path(path_or_preset)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} has no config.json: pass a Hugging Face model directory or one of the "
            f"presets {sorted(PRESETS)}"
        )
    from transformers import AutoConfig, AutoTokenizer

    hf_config = AutoConfig.from_pretrained(path)
    model = build_model(hf_config, dtype, device)
    load_weights(model, path)
    tokenizer = AutoTokenizer.from_pretrained(path) if _has_tokenizer(path) else None
    return LoadedModel(model, model.config, hf_config, tokenizer, eos_token_ids(path, hf_config))


def load_model_config(path_or_preset: str | Path) -> ModelConfig:
    """Only the shape of a preset or a local HF directory (no weights)."""
    from radixserve.model.presets import PRESETS, preset_hf_config

    if str(path_or_preset) in PRESETS:
        return ModelConfig.from_hf(preset_hf_config(str(path_or_preset)))
    from transformers import AutoConfig

    return ModelConfig.from_hf(AutoConfig.from_pretrained(path_or_preset))


def load_tokenizer(path_or_preset: str | Path) -> Any:
    """Only the tokenizer of a preset or a local HF directory (None if it has none)."""
    from radixserve.model.presets import PRESETS, preset_tokenizer

    if str(path_or_preset) in PRESETS:
        return preset_tokenizer(str(path_or_preset))
    path = Path(path_or_preset)
    if not _has_tokenizer(path):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


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
