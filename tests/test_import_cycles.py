"""No import cycle inside any package: the modules of each project package import each other as a
directed acyclic graph (docs/architecture.md), beside the package boundaries that
tests/test_import_boundaries.py checks between packages.

The graph is read with ``ast`` (nothing is imported), one node per module (``rag.retrieval.engine``;
a package is its ``__init__``). An edge is every import of a module of the same package wherever
it stands: at module top, inside a function (a lazy import still closes a cycle: it only moves
the failure to run time, and the two modules still cannot be understood apart), under
``TYPE_CHECKING``, or a literal ``importlib.import_module("...")``. ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``. The parent packages Python
initialises on the way to a module are not edges: they are only ``__init__`` files, which are
nodes of their own when something imports from them. A cycle is a strongly connected component
of more than one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_import_boundaries import ROOT, literal_import

PACKAGES = ("rag", "training", "evals", "ui", "indexes", "benchmarks")


def package_modules(package: str, root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``) for every .py file of
    ``package``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return out


def _known(name: str, modules: set[str]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules`` (``import a.b.c`` loads a.b.c)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def imported_modules(source: str, module: str, is_init: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` (the text of ``module``) imports, at any
    depth (see the module docstring)."""
    package = module.split(".") if is_init else module.split(".")[:-1]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {_known(alias.name, modules) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else _known(base, modules))
        elif name := literal_import(node):
            found.add(_known(name, modules))
    return {m for m in found if m is not None and m != module}


def import_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    mods = package_modules(package, root)
    names = set(mods)
    return {
        m: imported_modules(path.read_text(encoding="utf-8"), m, is_init, names)
        for m, (path, is_init) in mods.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _path(graph: dict[str, set[str]], component: list[str]) -> str:
    """The shortest cycle through the component's first module, for the failure message:
    ``a -> b -> ... -> a``."""
    start, inside = component[0], set(component)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w == start:
                    trail = [v]
                    while trail[-1] != start:
                        trail.append(came[trail[-1]])
                    return " -> ".join([*reversed(trail), start])
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise ValueError(f"{start} is on no cycle")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_the_package(package):
    graph = import_graph(package)
    found = cycles(graph)
    described = "\n".join(f"{', '.join(c)}: {_path(graph, c)}" for c in found)
    assert not found, f"import cycles in {package}/ (docs/architecture.md):\n{described}"


def test_the_graph_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "import pkg.b\ndef f():\n    from pkg.sub import c\n",
        "b.py": "from . import d\nif TYPE_CHECKING:\n    from pkg.sub.c import X\n",
        "d.py": "import importlib\nimportlib.import_module('pkg.a')\nimport os\n",
        "sub/__init__.py": "from .c import Y\n",
        "sub/c.py": "from ..d import Z\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph("pkg", tmp_path)
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b", "pkg.sub.c"},
        "pkg.b": {"pkg.d", "pkg.sub.c"},
        "pkg.d": {"pkg.a"},
        "pkg.sub": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg.d"},
    }
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.d", "pkg.sub.c"]]
    assert _path(graph, cycles(graph)[0]) == "pkg.a -> pkg.b -> pkg.d -> pkg.a"
    assert cycles({"x": {"y"}, "y": set()}) == []
