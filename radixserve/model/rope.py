"""Rotary position embeddings, with frequencies from transformers' own initialisers.

Reusing ``ROPE_INIT_FUNCTIONS`` keeps every scaling type (linear, dynamic, llama3, yarn, ...)
identical to the reference. Frequencies are fixed at load time: K is cached already rotated,
so they cannot change with the running sequence length. For ``dynamic`` that equals
transformers up to ``max_position_embeddings``.
"""

from __future__ import annotations

from typing import Any

import torch


def rope_parameters(hf: Any) -> dict:
    """The rope settings of a config, in transformers 5's ``rope_parameters`` form or 4's
    ``rope_theta`` + ``rope_scaling``."""
    params = getattr(hf, "rope_parameters", None)
    if params:
        return dict(params)
    scaling = dict(getattr(hf, "rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.get("type", "default"))
    return {"rope_theta": getattr(hf, "rope_theta", 10000.0), **scaling}


def rope_frequencies(hf: Any, head_dim: int) -> tuple[torch.Tensor, float]:
    """``inv_freq`` of shape ``[head_dim // 2]`` and the cos/sin scale (yarn's attention factor).

    A GGUF file may carry llama 3's scaling as per-dimension divisors instead of parameters
    (``rope_freq_factors``, set by the GGUF loader)."""
    inv_freq, scale = _scaled_frequencies(hf, head_dim)
    factors = getattr(hf, "rope_freq_factors", None)
    if factors is not None:
        inv_freq = inv_freq / torch.tensor(factors, dtype=torch.float32)
    return inv_freq, scale


def _scaled_frequencies(hf: Any, head_dim: int) -> tuple[torch.Tensor, float]:
    params = rope_parameters(hf)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (params["rope_theta"] ** exponents), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope type {rope_type!r}")
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    return inv_freq.float(), float(scale)


class RotaryEmbedding:
    """Not an ``nn.Module``: its frequencies must stay float32 when the model is cast."""

    def __init__(self, hf: Any, head_dim: int) -> None:
        self.inv_freq, self.scale = rope_frequencies(hf, head_dim)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and sin of shape ``[num_tokens, 1, head_dim]``, computed in float32."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)[:, None, :]
        return (angles.cos() * self.scale).to(dtype), (angles.sin() * self.scale).to(dtype)
