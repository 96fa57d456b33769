"""Built-in models with seeded random weights: no download, no disk.

``tiny`` is for tests; ``bench-135m`` has the architecture of SmolLM2-135M for benchmarks.
Weights are drawn in float32 on the CPU from a seeded generator, so a preset is the same on
every machine, device and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from radixserve.model.build import LoadedModel, build_model
from radixserve.model.tokenizer import SPECIAL_TOKENS, build_tokenizer


@dataclass(frozen=True)
class Preset:
    config: dict[str, Any]
    seed: int = 0
    init_std: float = 0.02
    tokenizer_vocab: int = 2048
    notes: str = ""
    vocab_size: int | None = field(default=None)  # None: the tokenizer's size


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        config=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=4096,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        ),
        notes="2 layers, hidden 64, GQA 4:2, for tests",
    ),
    "bench-135m": Preset(
        config=dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            max_position_embeddings=8192,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        ),
        vocab_size=49152,
        notes="the architecture of SmolLM2-135M",
    ),
}


def preset_hf_config(name: str):
    from transformers import LlamaConfig

    preset = _get(name)
    tokenizer = build_tokenizer(preset.tokenizer_vocab)
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    hf = LlamaConfig(
        vocab_size=preset.vocab_size or len(tokenizer),
        eos_token_id=eos,
        pad_token_id=tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[0]),
        bos_token_id=None,
        **preset.config,
    )
    hf.architectures = ["LlamaForCausalLM"]
    return hf


def preset_tokenizer(name: str):
    return build_tokenizer(_get(name).tokenizer_vocab)


def load_preset(
    name: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> LoadedModel:
    preset = _get(name)
    hf = preset_hf_config(name)
    model = build_model(hf, dtype, device)
    generator = torch.Generator().manual_seed(preset.seed)
    with torch.no_grad():
        for pname, param in sorted(model.named_parameters()):
            if pname.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                values = torch.randn(param.shape, generator=generator) * preset.init_std
                param.copy_(values)
    eos = tuple(hf.eos_token_id)
    return LoadedModel(model, model.config, hf, build_tokenizer(preset.tokenizer_vocab), eos)


def export_preset(name: str, directory: str | Path) -> Path:
    """Write a preset as a normal Hugging Face directory (config, safetensors, tokenizer,
    generation config) that transformers and radixserve both load."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_preset(name)
    loaded.hf_config.save_pretrained(out)
    GenerationConfig(
        eos_token_id=list(loaded.eos_token_ids), pad_token_id=loaded.hf_config.pad_token_id
    ).save_pretrained(out)
    tensors = {k: v.contiguous() for k, v in loaded.model.state_dict().items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    loaded.tokenizer.save_pretrained(out)
    return out


def _get(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]
