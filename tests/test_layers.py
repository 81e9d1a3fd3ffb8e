"""Layers run one way: no import cycle between speclab's top-level packages (speclab.X -> speclab.Y ->
... -> speclab.X), counting every import in every module, those inside functions included.

Run it as a script to see the graph: `python tests/test_layers.py` prints each package's imports of other
packages and every cycle (strongly connected group of packages)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "speclab"

# Imports known to close a cycle that is still to be broken, as (importing package, imported package): the
# graph without them must have no cycle. Remove an entry with the change that removes the import.
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}


def _unit(rel: Path) -> str:
    """The package a module belongs to: speclab/<pkg>/... -> pkg; a module at the root (speclab/x.py) is its
    own unit x; speclab/__init__.py is the root."""
    parts = rel.with_suffix("").parts
    return parts[0] if len(parts) > 1 else parts[0]


def _module_name(rel: Path) -> list[str]:
    parts = list(rel.with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports_between_packages(src: Path = SRC, root: str = "speclab") -> dict[str, dict[str, set[str]]]:
    """unit -> {imported unit: the files that import it}, a unit's own imports left out. Units are the
    packages and modules directly under `src`, the directory of package `root`."""
    depth = root.count(".") + 1
    graph: dict[str, dict[str, set[str]]] = {}
    for f in sorted(src.rglob("*.py")):
        rel = f.relative_to(src)
        unit = _unit(rel)
        if unit == "__init__":
            continue
        here = _module_name(rel)
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here if is_pkg else here[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    names = [".".join([root, *base, *([node.module] if node.module else [])])]
                else:
                    names = [node.module or ""]
                    if node.module == root:
                        names = [f"{root}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[:depth] != root.split(".") or len(parts) <= depth:
                    continue
                target = parts[depth]
                if target != unit:
                    graph.setdefault(unit, {}).setdefault(target, set()).add(str(rel))
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[frozenset[str]]:
    """The strongly connected groups of two or more packages (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []
    nodes = sorted(set(graph) | {t for e in graph.values() for t in e})

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(frozenset(group))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_packages() -> None:
    graph = imports_between_packages()
    kept = {a: {b: f for b, f in e.items() if (a, b) not in KNOWN_BACK_EDGES} for a, e in graph.items()}
    found = cycles(kept)
    assert not found, "import cycles between packages: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_policy_sits_below_simulate_and_live() -> None:
    g = imports_between_packages()
    for low in ("policy", "catalog"):
        for high in ("simulate", "live", "methods", "bench"):
            assert high not in g.get(low, {}), (low, high, sorted(g[low][high]))
    assert "simulate" not in g.get("live", {}), sorted(g["live"]["simulate"])


PACKAGES = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").is_file())


@pytest.mark.parametrize("package", PACKAGES)
def test_no_cycle_between_the_parts_of_a_package(package: str) -> None:
    """Inside every package: no cycle between its modules and subpackages (e.g. the simulator's api and its
    adaptive evaluation, or the workload registry and the file workloads it registers)."""
    found = cycles(imports_between_packages(SRC / package, root=f"speclab.{package}"))
    assert not found, [sorted(c) for c in found]


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.py").write_text("def f():\n    from speclab.b.y import g\n")
    (tmp_path / "b" / "y.py").write_text("from ..a import x\n")
    g = imports_between_packages(tmp_path)
    assert g["a"]["b"] == {"a/x.py"} and g["b"]["a"] == {"b/y.py"}
    assert cycles(g) == [frozenset({"a", "b"})]


if __name__ == "__main__":
    graph = imports_between_packages()
    for unit in sorted(graph):
        print(f"{unit} -> {', '.join(sorted(graph[unit]))}")
    for c in cycles(graph):
        print("cycle (all imports):", " <-> ".join(sorted(c)))
    kept = {a: {b: f for b, f in e.items() if (a, b) not in KNOWN_BACK_EDGES} for a, e in graph.items()}
    for (a, b), why in KNOWN_BACK_EDGES.items():
        print(f"known back edge {a} -> {b} ({', '.join(sorted(graph.get(a, {}).get(b, ())))}): {why}")
    print("cycles without the known back edges:", [sorted(c) for c in cycles(kept)] or "none")
