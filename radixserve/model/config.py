"""The architecture facts radixserve needs, read from a Hugging Face config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2, or Llama's attention_bias
    o_bias: bool  # Llama's attention_bias
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    context_len: int  # the longest context served exactly

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; radixserve supports "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}"
            )

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        archs = getattr(hf, "architectures", None) or []
        arch = archs[0] if archs else f"{type(hf).__name__.removesuffix('Config')}ForCausalLM"
        heads = hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        attention_bias = bool(getattr(hf, "attention_bias", False))
        # A sliding window shorter than the context would change results past it; serve
        # only as far as attention over the whole context is exact.
        window = getattr(hf, "sliding_window", None)
        uses_window = window and getattr(hf, "use_sliding_window", True)
        context = hf.max_position_embeddings
        if uses_window:
            context = min(context, window)
        return cls(
            architecture=arch,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_norm_eps=hf.rms_norm_eps,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or attention_bias,
            o_bias=attention_bias and arch != "Qwen2ForCausalLM",
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            context_len=context,
        )
