"""Attention over the paged KV pool, behind one small interface chosen by name."""

from __future__ import annotations

import torch

from radixserve.attention.base import AttentionBackend
from radixserve.attention.forward_batch import ExtendRequest, ForwardBatch
from radixserve.attention.native_backend import SUPPORTED_DTYPES as NATIVE_DTYPES
from radixserve.attention.native_backend import NativeAttentionBackend
from radixserve.attention.torch_backend import TorchAttentionBackend
from radixserve.cache.shared_paths import PrefixGroup
from radixserve.cpu import CpuProfile
from radixserve.memory.kv_pool import KVPool

BACKENDS = ("auto", "torch", "native", "flashinfer")


def resolve_backend_name(
    name: str,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    profile: CpuProfile | None = None,
) -> str:
    """``auto`` picks flashinfer on CUDA when it is installed, the native kernels on CPU when
    the profile has them (and they read ``dtype``), torch otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {BACKENDS}")
    if name != "auto":
        return name
    if torch.device(device).type == "cuda":
        try:
            import flashinfer  # noqa: F401

            return "flashinfer"
        except ImportError:
            return "torch"
    if dtype in NATIVE_DTYPES and profile is not None and profile.native:
        return "native"
    return "torch"


def create_attention_backend(
    name: str,
    kv_pool: KVPool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    cpu_profile: CpuProfile | None = None,
) -> AttentionBackend:
    """The backend ``name`` names; ``native`` runs on ``cpu_profile``'s choices."""
    name = resolve_backend_name(name, kv_pool.k[0].device, kv_pool.k[0].dtype, cpu_profile)
    if name == "native":
        if cpu_profile is None:
            raise ValueError("the native attention backend needs a CPU profile")
        return NativeAttentionBackend(
            kv_pool, num_heads, num_kv_heads, head_dim, scale, cpu_profile
        )
    if name == "flashinfer":
        from radixserve.attention.flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend(kv_pool, num_heads, num_kv_heads, head_dim, scale)
    return TorchAttentionBackend(kv_pool, num_heads, num_kv_heads, head_dim, scale)


__all__ = [
    "AttentionBackend",
    "ExtendRequest",
    "ForwardBatch",
    "NativeAttentionBackend",
    "PrefixGroup",
    "TorchAttentionBackend",
    "create_attention_backend",
    "resolve_backend_name",
]
