"""CPU profiles for tests: this machine's, with some choices changed."""

from dataclasses import replace

import torch

from radixserve.cpu import CpuProfile, probe_cpu_profile


def here() -> CpuProfile:
    return probe_cpu_profile()


def with_paths(dtype: torch.dtype, profile: CpuProfile | None = None, **changes) -> CpuProfile:
    """``profile`` (this machine's) with ``dtype``'s ``DtypePaths`` fields changed."""
    profile = profile or here()
    name = "float32" if dtype == torch.float32 else "bfloat16"
    return replace(profile, **{name: replace(getattr(profile, name), **changes)})


def make_backend(cls, *args, profile: CpuProfile | None = None):
    """An attention backend of class ``cls``; the native one runs on ``profile``."""
    from radixserve.attention import NativeAttentionBackend

    if cls is NativeAttentionBackend:
        return cls(*args, profile or here())
    return cls(*args)
