"""The CPU profile: fixed rules from the machine's features, the same in every process, pinned
by a file, refused where it asks for what the machine lacks; and the CPU package's place in
the import graph."""

import ast
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from radixserve import Engine, SamplingParams
from radixserve.attention import AttentionBackend
from radixserve.cpu import CpuFeatures, CpuProfile, load_profile, probe_cpu_profile
from radixserve.cpu import profile as profile_module
from radixserve.cpu.linear import Linear
from radixserve.cpu.native import native_available
from radixserve.cpu.profile import ALWAYS, NEVER, profile_for
from radixserve.server import create_app

PACKAGE = Path(__file__).parents[2] / "radixserve"


def features(vendor="GenuineIntel", isa=("avx2", "avx512f"), bf16_dot=False, capability="AVX512"):
    return CpuFeatures(vendor, "test CPU", tuple(isa), capability, bf16_dot)


def test_amd_multiplies_float32_on_onednn_and_bfloat16_blocks_natively():
    amd = features("AuthenticAMD", ("avx2", "avx512f", "avx512_bf16"), bf16_dot=True)
    p = profile_for(amd, native=True, packs=True)
    assert p.float32.onednn_rows is not None and p.float32.dense_kernel == "native"
    assert p.bfloat16.dense_kernel == "native" and p.bfloat16.panel_rows > 0
    assert p.bfloat16.dense_min_work < p.float32.dense_min_work  # the block kernel's bf16 dots


def test_intel_with_amx_keeps_torchs_float32_gemm_and_flash_for_bfloat16():
    amx = features(isa=("avx2", "avx512f", "avx512_bf16", "amx_tile"), bf16_dot=True)
    p = profile_for(amx, native=True, packs=True)
    assert p.float32.onednn_rows is None and p.float32.dense_kernel == "native"
    assert p.bfloat16.dense_kernel == "flash" and p.bfloat16.onednn_rows is not None
    assert 0 < p.bfloat16.native_rows < ALWAYS  # torch's bfloat16 GEMM is fast here


def test_without_bfloat16_instructions_bfloat16_rows_all_go_native():
    p = profile_for(features(isa=("avx2",), capability="AVX2"), native=True, packs=True)
    assert p.bfloat16.native_rows == ALWAYS and p.bfloat16.panel_rows == NEVER
    assert p.bfloat16.onednn_rows is None


def test_without_native_kernels_nothing_native_is_chosen():
    p = profile_for(features(), native=False, packs=False)
    for paths in (p.float32, p.bfloat16):
        assert paths.native_rows == paths.panel_rows == NEVER
        assert paths.dense_kernel == "flash" and paths.onednn_rows is None


def test_a_profile_survives_json(tmp_path):
    p = replace(probe_cpu_profile(), cascade_min_queries=7)
    p.save(tmp_path / "p.json")
    assert CpuProfile.from_dict(json.loads((tmp_path / "p.json").read_text())) == p


def test_two_fresh_processes_report_the_same_profile():
    cmd = [sys.executable, "-m", "radixserve.cli", "cpu-profile"]
    runs = [subprocess.run(cmd, capture_output=True, text=True, check=True) for _ in range(2)]
    first, second = (json.loads(r.stdout) for r in runs)
    assert first == second == json.loads(json.dumps(probe_cpu_profile().to_dict()))


def test_a_pinned_profile_runs_the_engine_and_shows_in_server_info(tmp_path):
    here = probe_cpu_profile()
    other = replace(here.features, model="another CPU of the same features")
    pinned = replace(here, features=other, cascade_min_queries=5, few_rows=64)
    pinned.save(tmp_path / "pinned.json")
    with Engine("tiny", cpu_profile=str(tmp_path / "pinned.json")) as engine:
        assert engine.cpu_profile == pinned
        model = engine.runner.loaded.model
        assert {m.profile for m in model.modules() if isinstance(m, Linear)} == {pinned}
        if native_available():
            assert engine.runner.backend.profile == pinned
        params = SamplingParams(max_new_tokens=3, temperature=0, ignore_eos=True)
        out = engine.generate("a pinned profile", params)
        assert len(out["token_ids"]) == 3
        with TestClient(create_app(engine, "tiny")) as client:
            info = client.get("/server_info").json()
        assert info["cpu_profile"] == json.loads(json.dumps(pinned.to_dict()))


def test_a_profile_asking_for_what_the_machine_lacks_is_refused(tmp_path, monkeypatch):
    here = probe_cpu_profile()
    path = tmp_path / "p.json"
    if native_available():
        replace(here, native=False).save(path)
        with pytest.raises(ValueError, match="RADIXSERVE_NATIVE=0"):
            load_profile(path)
        no_dot = replace(here.features, bf16_dot=False)
        monkeypatch.setattr(profile_module, "detect_features", lambda: no_dot)
        with_panels = replace(here, bfloat16=replace(here.bfloat16, panel_rows=8))
        with pytest.raises(ValueError, match="AVX512_BF16"):
            Engine("tiny", cpu_profile=with_panels)
    path.write_text('{"features": {}}')
    with pytest.raises(ValueError, match="not a CPU profile"):
        load_profile(path)
    path.write_text(json.dumps({**json.loads(json.dumps(here.to_dict())), "float32": {}}))
    with pytest.raises(ValueError, match="not a CPU profile"):
        load_profile(path)
    with pytest.raises(ValueError, match="dense_kernel"):
        replace(here.float32, dense_kernel="fastest")
    with pytest.raises(ValueError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_cpu_package_sits_below_model_and_attention_only():
    """Below engine/, only model/ and attention/ import the CPU package; it imports nothing of
    theirs (nor anything above); no module there times kernels to choose one."""
    for path in PACKAGE.rglob("*.py"):
        layer = path.relative_to(PACKAGE).parts[0]
        imports = _imports(path)
        uses_cpu = any(n == "radixserve.cpu" or n.startswith("radixserve.cpu.") for n in imports)
        if layer in ("cache", "memory"):
            assert not uses_cpu, f"{path} imports the CPU package"
        if layer == "cpu":
            above = ("model", "attention", "engine", "server", "bench", "cluster", "lang", "sim")
            bad = [n for n in imports if n.split(".")[:2] in [["radixserve", a] for a in above]]
            assert not bad, f"{path} imports {bad}"
        if layer in ("cpu", "model", "attention"):
            assert "time" not in imports, f"{path} times something"


def test_the_attention_interface_has_no_native_plan():
    assert not hasattr(AttentionBackend, "decode_plan")
