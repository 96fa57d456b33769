"""Import cycles that cross a folder of radixserve/ (imports inside functions count; those
under ``if TYPE_CHECKING:`` do not). Prints each cycle's modules; exits 1 when any."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "radixserve"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def folder(module: str, packages: set[str]) -> str:
    return module if module in packages else module.rpartition(".")[0]


def cycles() -> list[list[str]]:
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    packages = {module_name(p) for p in ROOT.rglob("__init__.py")}
    graph = {m: imports(p, set(paths)) - {m} for m, p in paths.items()}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len({folder(m, packages) for m in component}) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    found = cycles()
    for component in found:
        print("cycle across folders:", ", ".join(component))
    sys.exit(1 if found else 0)
