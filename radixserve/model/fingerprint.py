"""A short name for a model's weights, for caches that outlive the process: two models (or
two versions of one checkpoint) with different weights get different names."""

from __future__ import annotations

import hashlib

import torch

SAMPLE = 4096  # values read from each parameter


def weights_fingerprint(model: torch.nn.Module) -> str:
    """Hash of every parameter's name, shape, dtype and first values."""
    h = hashlib.blake2b(digest_size=12)
    for name, param in sorted(model.named_parameters()):
        h.update(f"{name}|{tuple(param.shape)}|{param.dtype}".encode())
        sample = param.detach().reshape(-1)[:SAMPLE].float().cpu().contiguous()
        h.update(sample.numpy().tobytes())
    return h.hexdigest()
