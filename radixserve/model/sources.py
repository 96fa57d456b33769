"""What a model argument names, and where its files are.

One string selects a model everywhere (``Engine(model)``, ``--model``): a built-in preset
(``tiny``), a named real model (``smollm2-135m-instruct``, pulled on first use), a GGUF file
or a directory holding one, a Hugging Face checkpoint directory, or a Hugging Face model id
(``org/name``: from the hub's cache, downloaded when online).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from radixserve.model.presets import PRESETS
from radixserve.model.pull import NAMED_MODELS, pull

_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# the files of a hub checkpoint radixserve reads (not other formats' weights)
_HF_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.jinja", "*.txt", "*.model"]


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "preset", "hf" (a checkpoint directory) or "gguf" (a file)
    path: Path | None  # None for a preset
    name: str  # the argument it came from


class ModelSourceError(ValueError):
    """A model argument that names nothing we can load; the message says what would."""


def resolve_model(spec: str | Path, log=print) -> ModelSource:
    """Find (and for a named model, pull) what ``spec`` names."""
    name = str(spec)
    if name in PRESETS:
        return ModelSource("preset", None, name)
    if name in NAMED_MODELS:
        return ModelSource("gguf", pull(name, log), name)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", path, name)
    if path.is_dir():
        return _directory(path, name)
    if _HF_ID.fullmatch(name) and not path.exists():
        return _directory(_hub_snapshot(name), name)
    raise ModelSourceError(
        f"model {name!r} is not a preset ({', '.join(PRESETS)}), a named model "
        f"({', '.join(NAMED_MODELS)}), a GGUF file, a checkpoint directory or a "
        "Hugging Face id (org/name)"
    )


def _directory(path: Path, name: str) -> ModelSource:
    if (path / "config.json").is_file():
        return ModelSource("hf", path, name)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource("gguf", ggufs[0], name)
    if ggufs:
        listing = ", ".join(p.name for p in ggufs)
        raise ModelSourceError(f"{path} holds several GGUF files ({listing}): pass one of them")
    raise ModelSourceError(f"{path} holds neither a config.json nor a GGUF file")


def _hub_snapshot(repo_id: str) -> Path:
    """The local snapshot of a hub model: the cache's under ``HF_HUB_OFFLINE=1``, else
    downloaded (or refreshed) by ``huggingface_hub``."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HF_PATTERNS))
    except Exception as exc:  # the hub's errors have no common base besides OSError/ValueError
        raise ModelSourceError(
            f"could not load {repo_id!r} from the Hugging Face hub or its cache "
            f"({type(exc).__name__}: {exc}). Offline, download it first where the hub is "
            "reachable (the cache is then used with HF_HUB_OFFLINE=1), or pass a local path"
        ) from exc
