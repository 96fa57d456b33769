"""The native CPU kernels' build: paged attention read in place from the KV pool, the radix
tree's edge comparison, linear layers for few rows, the fused elementwise steps.

The C++ sources sit in ``csrc/`` beside this file and are compiled on first use with torch's
extension loader (cached under ``~/.cache/torch_extensions``, one folder per version of the
sources and CPU). Nothing here is needed to import or run radixserve: when the build
cannot happen (no compiler, no ninja, ``RADIXSERVE_NATIVE=0``) :func:`load_native` logs one
line and returns ``None``, and callers keep their torch/Python paths, which are also the
references the tests compare with.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

SOURCES = (
    "bindings.cpp",
    "block_attention.cpp",
    "decode_layers.cpp",
    "elementwise.cpp",
    "linear_rows.cpp",
    "merge_states.cpp",
    "paged_attention.cpp",
    "paged_few.cpp",
    "panel_linear.cpp",
    "prefix_match.cpp",
    "quant_int8.cpp",
    "quant_linear.cpp",
    "quant_ops.cpp",
)
SOURCE_DIR = Path(__file__).parent / "csrc"
DISABLE_ENV = "RADIXSERVE_NATIVE"
_FLAGS = ["-O3", "-std=c++17", "-fopenmp"]


@functools.cache
def load_native(march: str = "native") -> ModuleType | None:
    """The compiled module, or ``None`` (said once in the log) when it cannot be built.
    ``march`` is the compiler's target: the engine builds for this CPU; tests also build for
    ``x86-64-v3`` (AVX2, no AVX-512) to check the narrower vector paths on any x86 machine."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        logger.info("native kernels disabled by %s=0", DISABLE_ENV)
        return None
    try:
        from torch.utils import cpp_extension

        _put_ninja_on_path()
        here = SOURCE_DIR
        with _sole_builder(build_directory(march)):
            return cpp_extension.load(
                name=_module_name(march),
                sources=[str(here / s) for s in SOURCES],
                extra_cflags=[*_FLAGS, f"-march={march}"],
                verbose=False,
            )
    except Exception as exc:  # a missing compiler surfaces as many different exception types
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        logger.warning("native kernels unavailable, using the torch/Python paths: %s", reason)
        return None


def build_directory(march: str = "native") -> Path:
    """Where torch's loader builds the module for ``march`` (it creates the folder)."""
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(_module_name(march), False))


@contextlib.contextmanager
def _sole_builder(build_dir: Path):
    """One radixserve process at a time builds or loads in ``build_dir``, by an flock the
    kernel drops when its holder dies. torch's own lock file there, left by a build that was
    killed, makes every later load wait forever; under the flock it can only be such a
    leftover, and it goes."""
    with open(build_dir / "radixserve.flock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            logger.warning("removing %s, left by an interrupted build", stale)
            stale.unlink(missing_ok=True)
        yield


def native_available() -> bool:
    return load_native() is not None


def _module_name(march: str) -> str:
    """The name carries a hash of the sources and, built with ``-march=native``, of the CPU's
    feature flags: a cache directory shared between machines never hands one the other's
    binary, and two checkouts of different sources do not rebuild over each other."""
    digest = hashlib.sha256(march.encode())
    for name in SOURCES + tuple(sorted(p.name for p in SOURCE_DIR.glob("*.h"))):
        digest.update(name.encode() + (SOURCE_DIR / name).read_bytes())
    if march == "native":
        digest.update(cpu_flags_line().encode())
    return f"radixserve_native_{march.replace('-', '_')}_{digest.hexdigest()[:10]}"


def cpu_flags_line() -> str:
    """The ``flags`` line of ``/proc/cpuinfo`` ('' where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _put_ninja_on_path() -> None:
    """torch's loader runs ``ninja`` from PATH; the pip package's binary may not be there
    when the interpreter is called without activating its environment."""
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, "BIN_DIR", None)
    if bin_dir and bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
