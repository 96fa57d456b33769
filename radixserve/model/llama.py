"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over the paged KV pool.

Module and parameter names follow Hugging Face's, so a checkpoint's tensors load by name.
The model sees tokens and a ``ForwardBatch``; it knows nothing of requests or the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixserve.attention import AttentionBackend, ForwardBatch
from radixserve.cpu import CpuProfile
from radixserve.cpu.decode_layers import DecodeLayers
from radixserve.cpu.elementwise import rms_norm, rope_, silu_mul
from radixserve.cpu.linear import FusedLinear, Linear, PackedWeight, cpu_linear, pack, use_profile
from radixserve.cpu.quant_linear import (
    FusedQuantLinear,
    QuantizedEmbedding,
    QuantizedLinear,
    fusable,
    quant_linear,
)
from radixserve.model.config import ModelConfig
from radixserve.model.rope import RotaryEmbedding


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The norm of ``x``; given ``residual``, ``residual += x`` first and its norm."""
        return rms_norm(x, self.weight, self.eps, residual)


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

    # q, k and v's projections as one product once the weights are packed, else None
    qkv: FusedLinear | FusedQuantLinear | None = None

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        backend: AttentionBackend,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every token's output, or with ``keep`` only those tokens' (all of them still
        attend and write their K/V)."""
        n = x.shape[0]
        if self.qkv is not None:
            q, k, v = self.qkv(x)  # views of one product: rows are strided
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        # q: [num_tokens, heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim]
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope_(q, *cos_sin), rope_(k, *cos_sin)
        out = backend.forward(self.layer, q, k, v, batch)
        if keep is not None:
            out = out[keep]
        return self.o_proj(out.reshape(len(out), self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    # gate and up's projections as one product once the weights are packed, else None
    gate_up: FusedLinear | FusedQuantLinear | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(silu_mul(gate, up))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x, residual, cos_sin, batch, backend, keep=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(this layer's MLP output, the residual stream before it)``: each layer adds the
        previous one's output to the stream inside its first norm. ``keep``: the tokens whose
        outputs are wanted (the rest only leave their K/V)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos_sin, batch, backend, keep)
        if keep is not None:
            residual = residual[keep]
        return self.mlp(self.post_attention_layernorm(h, residual)), residual


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

    # the CPU paths of the projections (``use_cpu_profile``); None: torch's own
    cpu_profile: CpuProfile | None = None
    # the output weight again in its fast paths' layouts (``pack``); a tied one is no ``Linear``
    output_packed: PackedWeight | None = None
    # a decode step's layers in one native call, once the weights are packed for it
    decode_layers: DecodeLayers | None = None

    def use_cpu_profile(self, profile: CpuProfile, pack_weights: bool = True) -> int:
        """Run the projections on ``profile``'s paths. With ``pack_weights``, first fuse each
        layer's q/k/v and gate/up projections, lay every weight out again for its faster
        paths, and give decode steps their native loop where it runs (``DecodeLayers``);
        returns the bytes that adds."""
        self.cpu_profile = profile
        for m in self.modules():
            if isinstance(m, QuantizedLinear | QuantizedEmbedding):
                m.profile = profile
        if not pack_weights:
            return use_profile(self, profile, packed=False)
        added = 0
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv, gate_up = [attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]
            attn.qkv = _fused(qkv, profile)
            mlp.gate_up = _fused(gate_up, profile)
            fused = (f for f in (attn.qkv, mlp.gate_up) if isinstance(f, FusedLinear) and f.packed)
            added += sum(f.packed.nbytes for f in fused)
        added += use_profile(self, profile, packed=True)
        if self.config.tie_word_embeddings and not self.quantized_output:
            self.output_packed = pack(self.output_weight, profile)
            added += self.output_packed.nbytes if self.output_packed else 0
        self.decode_layers = DecodeLayers.build(self, profile)
        return added

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """float32 logits of the final-normed states ``x``."""
        if self.quantized_output:
            return quant_linear(x, self.model.embed_tokens.quant, None, self.cpu_profile).float()
        if self.config.tie_word_embeddings:
            weight, packed = self.output_weight, self.output_packed
            return cpu_linear(x, weight, None, self.cpu_profile, packed).float()
        return self.lm_head(x).float()

    @property
    def quantized_output(self) -> bool:
        """The output head is the quantized embeddings (tied)."""
        tied = self.config.tie_word_embeddings
        return tied and isinstance(self.model.embed_tokens, QuantizedEmbedding)

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
        last_index = batch.logit_index()
        # Only each request's last token (or last few: ``logit_lens``) reaches the logits:
        # past the last layer's attention (o_proj, MLP) the others are dropped.
        every_token = batch.return_all_logits or len(last_index) == len(x)
        if self.decode_layers is not None and (
            out := self.decode_layers(x, cos_sin, batch, backend)
        ):
            x, residual = out
        else:
            residual, layers = None, self.model.layers
            for i, layer in enumerate(layers):
                keep = None if every_token or i < len(layers) - 1 else last_index
                x, residual = layer(x, residual, cos_sin, batch, backend, keep)
        if batch.return_all_logits:
            every = self.logits(self.model.norm(x, residual))
            return Logits(every[last_index], every)
        return Logits(self.logits(self.model.norm(x, residual)))


def _fused(parts: list[nn.Module], profile: CpuProfile) -> FusedLinear | FusedQuantLinear | None:
    """One product for projections over one input: float ones, or quantized of one layout."""
    if all(isinstance(p, Linear) for p in parts):
        return FusedLinear(parts, profile)
    return FusedQuantLinear(parts, profile) if fusable(parts) else None
