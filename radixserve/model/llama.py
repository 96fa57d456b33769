"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over the paged KV pool.

Module and parameter names follow Hugging Face's, so a checkpoint's tensors load by name.
The model sees tokens and a ``ForwardBatch``; it knows nothing of requests or the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.attention import AttentionBackend, ForwardBatch
from radixserve.model.config import ModelConfig
from radixserve.model.linear import Linear, linear
from radixserve.model.rope import RotaryEmbedding, apply_rope


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32, scale in the input dtype: transformers' order of rounding.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_proj = Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        n = x.shape[0]
        # q: [num_tokens, heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
        out = backend.forward(self.layer, q, k, v, batch)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos_sin, batch, backend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, batch, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """Hugging Face's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass(frozen=True)
class Logits:
    """float32 logits: ``last`` is ``[batch, vocab]`` (each request's last new token);
    ``all`` is ``[num_tokens, vocab]`` when the batch asked for every token."""

    last: torch.Tensor
    all: torch.Tensor | None = None


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, hf_config: Any) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderStack(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        with torch.device("cpu"):  # real frequencies even when the model is built on "meta"
            self.rotary = RotaryEmbedding(hf_config, cfg.head_dim)

    @property
    def output_weight(self) -> torch.Tensor:
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, backend: AttentionBackend) -> Logits:
        backend.prepare(batch)
        x = self.model.embed_tokens(batch.input_ids)
        cos_sin = self.rotary.cos_sin(batch.positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos_sin, batch, backend)
        last_index = torch.cumsum(torch.tensor(batch.extend_lens, device=x.device), 0) - 1
        if batch.return_all_logits:
            every = linear(self.model.norm(x), self.output_weight).float()
            return Logits(every[last_index], every)
        return Logits(linear(self.model.norm(x[last_index]), self.output_weight).float())
