"""``CpuProfile``: every CPU fast path the engine takes, decided once per process.

The machine's features are read from ``/proc/cpuinfo`` and torch, and each choice follows
from them by a fixed rule (no timing): the same machine gives the same profile, run after
run. A profile saved as JSON (``save``/``load``, ``Engine(cpu_profile=...)``,
``--cpu-profile FILE``) pins every choice; ``docs/performance.md`` says where each rule
comes from.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from radixserve.cpu import onednn
from radixserve.cpu.native import cpu_flags_line, load_native

logger = logging.getLogger(__name__)

# The instruction sets a choice depends on, as /proc/cpuinfo names them.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")
DENSE_KERNELS = ("native", "flash")
NEVER = 0  # a row bound that no batch meets
ALWAYS = 1 << 30  # a row bound that every batch meets


@dataclass(frozen=True)
class CpuFeatures:
    vendor: str  # GenuineIntel, AuthenticAMD, ...
    model: str
    isa: tuple[str, ...]  # the ISA_FLAGS present
    torch_capability: str  # torch's dispatch level: AVX512, AVX2, DEFAULT, ...
    bf16_dot: bool  # the native kernels were built with AVX512_BF16's pairwise dot products

    @property
    def amx(self) -> bool:
        return "amx_tile" in self.isa

    @property
    def bf16_gemm(self) -> bool:
        """torch's (oneDNN's) bfloat16 GEMM runs on bfloat16 instructions here."""
        return self.amx or "avx512_bf16" in self.isa


@dataclass(frozen=True)
class DtypePaths:
    """The paths of one weight/activation dtype. Row bounds count a product's input rows."""

    native_rows: int  # up to which a plain weight goes to the native row kernel
    panel_rows: int  # up to which a packed weight multiplies on column panels (0: no panels)
    onednn_rows: int | None  # from which a packed weight goes to oneDNN (None: not packed)
    dense_kernel: str  # who runs dense attention blocks: "native" (block kernel) or "flash"
    dense_min_work: int  # queries x keys per KV head from which cached keys make a block
    self_min_tokens: int  # new tokens from which an extend attends over itself in a block

    def __post_init__(self) -> None:
        if self.dense_kernel not in DENSE_KERNELS:
            raise ValueError(
                f"dense_kernel must be one of {DENSE_KERNELS}, not {self.dense_kernel!r}"
            )


@dataclass(frozen=True)
class CpuProfile:
    features: CpuFeatures
    native: bool  # the native kernels are built and used
    float32: DtypePaths
    bfloat16: DtypePaths
    few_rows: int = 128  # float32 rows up to which torch multiplies weight-first
    dense_min_queries: int = 96  # queries per KV head from which a group member makes a block
    cascade_min_queries: int = 32  # queries per KV head from which a group stays a cascade
    quant_rows: int = 32  # rows up to which a quantized weight multiplies from its codes
    # rows up to which a 4-bit weight's product rounds activations to int8 per group of 32
    # and multiplies in integers (0, the rule everywhere for now: activations stay float32)
    quant_int8_rows: int = 0

    def paths(self, dtype: torch.dtype) -> DtypePaths | None:
        """The paths of ``dtype``, or None where it has no fast path (torch's own ops)."""
        if dtype == torch.float32:
            return self.float32
        return self.bfloat16 if dtype == torch.bfloat16 else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CpuProfile:
        try:
            feats = dict(data["features"])
            feats["isa"] = tuple(feats["isa"])
            return cls(
                features=CpuFeatures(**feats),
                float32=DtypePaths(**data["float32"]),
                bfloat16=DtypePaths(**data["bfloat16"]),
                **{k: v for k, v in data.items() if k not in ("features", "float32", "bfloat16")},
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a CPU profile: {exc}") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def summary(self) -> str:
        """One line for the log: the CPU and each dtype's choices."""
        f, parts = self.features, []
        for name in ("float32", "bfloat16"):
            p = getattr(self, name)
            onednn = "no" if p.onednn_rows is None else f">={p.onednn_rows} rows"
            parts.append(
                f"{name}: native<={p.native_rows} panels<={p.panel_rows} oneDNN {onednn}"
                f" blocks={p.dense_kernel}"
            )
        native = "native kernels" if self.native else "no native kernels"
        return f"{f.model} ({','.join(f.isa) or 'no AVX'}), {native}; " + "; ".join(parts)


def load_profile(path: str | Path) -> CpuProfile:
    """A pinned profile from ``path``, checked against what this machine can run."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the CPU profile {path}: {exc}") from exc
    profile = CpuProfile.from_dict(data)
    check_runs_here(profile)
    logger.info("CPU profile pinned by %s: %s", path, profile.summary())
    return profile


def check_runs_here(profile: CpuProfile) -> None:
    """A profile that asks for what this machine lacks is refused, naming the field; one made
    on another CPU but runnable here is used (the point of pinning), with a log line."""
    here = detect_features()
    built = load_native() is not None
    if profile.native and not built:
        raise ValueError(
            "the CPU profile sets native: true, but the native kernels do not build here"
        )
    if built and not profile.native:
        raise ValueError("the CPU profile sets native: false: run with RADIXSERVE_NATIVE=0")
    if profile.bfloat16.panel_rows and not here.bf16_dot:
        raise ValueError("the CPU profile's bfloat16.panel_rows needs AVX512_BF16, absent here")
    if profile.features != here:
        logger.info("CPU profile made on %s, pinned on %s", profile.features.model, here.model)


@functools.cache
def detect_features() -> CpuFeatures:
    flags = set(cpu_flags_line().split(":", 1)[-1].split())
    vendor = model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key.strip() == "model name" and not model:
                    model = value.strip()
    except OSError:
        pass
    kernels = load_native()
    return CpuFeatures(
        vendor=vendor,
        model=model,
        isa=tuple(f for f in ISA_FLAGS if f in flags),
        torch_capability=torch.backends.cpu.get_cpu_capability(),
        bf16_dot=bool(kernels is not None and kernels.bf16_dot()),
    )


@functools.cache
def probe_cpu_profile() -> CpuProfile:
    """This machine's profile by the fixed rules below (cached: one per process)."""
    profile = profile_for(detect_features(), load_native() is not None, onednn.available())
    logger.info("CPU profile: %s", profile.summary())
    return profile


def profile_for(f: CpuFeatures, native: bool, packs: bool) -> CpuProfile:
    """The rules. Row and work bounds are where one path overtook the other on bench-135m's
    shapes (``docs/performance.md``); the vendor rules follow which BLAS torch runs fast:
    MKL's float32 GEMM is slow on AMD, where oneDNN on packed weights and the native block
    kernel win; torch's bfloat16 flash kernel is fast only on AMX tiles. ``native``: the
    kernels build; ``packs``: oneDNN can lay weights out ahead of time."""
    amd = f.vendor == "AuthenticAMD"
    self_f32 = 2048 if f.torch_capability == "AVX512" else 1024
    f32 = DtypePaths(
        native_rows=48 if native else NEVER,
        panel_rows=64 if native else NEVER,
        onednn_rows=24 if amd and packs else None,
        dense_kernel="native" if native else "flash",
        dense_min_work=1 << 19,
        self_min_tokens=1024 if native else self_f32,
    )
    bf16_native_blocks = native and not f.amx
    bf16_dot_blocks = bf16_native_blocks and f.bf16_dot
    if bf16_dot_blocks:
        bf16_self = 128
    elif bf16_native_blocks:
        bf16_self = 1024
    else:
        bf16_self = 256 if f.amx else self_f32
    bf16 = DtypePaths(
        native_rows=(8 if f.bf16_gemm else ALWAYS) if native else NEVER,
        panel_rows=128 if native and f.bf16_dot else NEVER,
        onednn_rows=5 if f.bf16_gemm and packs else None,
        dense_kernel="native" if bf16_native_blocks else "flash",
        dense_min_work=1 << 15 if bf16_dot_blocks else (1 << 17 if f.amx else 1 << 19),
        self_min_tokens=bf16_self,
    )
    return CpuProfile(features=f, native=native, float32=f32, bfloat16=bf16)
