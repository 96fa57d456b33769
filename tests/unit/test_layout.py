"""The house's shape, checked: files short enough to read, chat formats apart from the
engine, no import cycle across folders, a request finished in one place, a README that is
a front page whose links all lead somewhere."""

import ast
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "radixserve"


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_files_stay_short():
    lengths = {p: len(p.read_text().splitlines()) for p in _sources()}
    assert lengths[PACKAGE / "engine/engine.py"] <= 320
    assert lengths[PACKAGE / "engine/scheduler/scheduler.py"] <= 320
    assert [str(p) for p, n in lengths.items() if n > 350] == []


def test_chat_formats_import_nothing_of_the_engine():
    for path in (PACKAGE / "chat").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("radixserve.engine"), path
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("radixserve.engine") for a in node.names), path


def test_no_import_cycle_crosses_a_folder():
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "tools/import_cycles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.cycles() == []


def test_only_req_finish_ends_a_request():
    writers = []
    for path in _sources():
        if path == PACKAGE / "engine/req.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            names = [n for t in targets for n in ast.walk(t) if isinstance(n, ast.Attribute)]
            if any(n.attr in ("finish_reason", "matched_stop") for n in names):
                writers.append(f"{path}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr == "FINISHED":
                writers.append(f"{path}:{node.lineno}")
    assert writers == []


def test_the_readme_is_a_front_page_whose_links_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if "://" not in target and not target.startswith("mailto:"):
                assert (page.parent / target).exists(), f"{page.name} links {target}"
