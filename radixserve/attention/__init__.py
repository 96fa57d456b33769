"""Attention over the paged KV pool, behind one small interface chosen by name."""

from __future__ import annotations

import torch

from radixserve.attention.base import AttentionBackend
from radixserve.attention.forward_batch import ExtendRequest, ForwardBatch
from radixserve.attention.torch_backend import TorchAttentionBackend
from radixserve.memory.kv_pool import KVPool

BACKENDS = ("auto", "torch", "flashinfer")


def resolve_backend_name(name: str, device: torch.device | str) -> str:
    """``auto`` picks flashinfer on CUDA when it is installed, torch otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {BACKENDS}")
    if name != "auto":
        return name
    if torch.device(device).type == "cuda":
        try:
            import flashinfer  # noqa: F401

            return "flashinfer"
        except ImportError:
            pass
    return "torch"


def create_attention_backend(
    name: str,
    kv_pool: KVPool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
) -> AttentionBackend:
    name = resolve_backend_name(name, kv_pool.k[0].device)
    if name == "flashinfer":
        from radixserve.attention.flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend(kv_pool, num_heads, num_kv_heads, head_dim, scale)
    return TorchAttentionBackend(kv_pool, num_heads, num_kv_heads, head_dim, scale)


__all__ = [
    "AttentionBackend",
    "ExtendRequest",
    "ForwardBatch",
    "TorchAttentionBackend",
    "create_attention_backend",
    "resolve_backend_name",
]
