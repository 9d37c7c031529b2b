"""Package boundaries (docs/architecture.md): imports flow ui -> rag -> indexes, training -> rag,
evals -> rag and training, and nowhere else; benchmarks may import anything but tests.

Every .py file of the packages is parsed with ``ast`` (nothing is imported), and every import of
a project package counts wherever it stands: module top, inside a function, under
``TYPE_CHECKING``, or a literal ``importlib.import_module("...")``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("rag", "indexes", "training", "evals", "ui", "benchmarks", "tests")
# package -> the other project packages it may import (its own is always allowed)
ALLOWED: dict[str, set[str]] = {
    "indexes": set(),
    "rag": {"indexes"},
    "ui": {"rag"},
    "training": {"rag"},
    "evals": {"rag", "training"},
    "benchmarks": set(PROJECT) - {"benchmarks", "tests"},
}


def imported_packages(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``source``, at any depth.
    Relative imports stay inside the importing package and are not reported."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif (
            isinstance(node, ast.Call)
            and _called_name(node.func) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            found.append((node.lineno, node.args[0].value.split(".")[0]))
    return found


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def violations(package: str) -> list[str]:
    """``path:line: imports X`` for every import of a project package ``package`` may not use."""
    allowed = ALLOWED[package] | {package}
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT)
        for line, top in imported_packages(path.read_text(encoding="utf-8"), str(rel)):
            if top in PROJECT and top not in allowed:
                out.append(f"{rel}:{line}: imports {top}")
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_allowed_packages(package):
    assert (ROOT / package / "__init__.py").is_file(), f"{package}/ is not a package any more"
    bad = "\n".join(violations(package))
    allowed = ", ".join(sorted(ALLOWED[package])) or "no other project package"
    assert not bad, f"{package} may import only {allowed} (docs/architecture.md):\n{bad}"


def test_walker_sees_imports_at_any_depth():
    source = """
import os, evals.qa
from training.lora import x
from . import sibling
from .cli import y
if TYPE_CHECKING:
    from ui.app import App

def f():
    import rag.metrics
    class C:
        def g(self):
            from indexes.base import VectorIndex
    importlib.import_module("benchmarks.decode")
"""
    tops = sorted(top for _, top in imported_packages(source))
    assert tops == ["benchmarks", "evals", "indexes", "os", "rag", "training", "ui"]


def test_every_package_is_walked():
    for package in ALLOWED:
        assert len(list((ROOT / package).rglob("*.py"))) >= 2, package


# packages whose modules import each other in one direction only (rag is not yet one of them)
ACYCLIC = ("indexes", "ui", "training", "evals", "benchmarks")


def module_imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same ``package`` it imports, at any depth (as above), with
    ``from package import module`` counted as importing that module."""
    paths = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (ROOT / package).rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (``[a, b, a]``), or [] when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


@pytest.mark.parametrize("package", ACYCLIC)
def test_package_has_no_import_cycle(package):
    """A module that needs a piece of another which needs it back moves the piece to a third
    (training.defaults holds values only; training.qa_example is what lora_data and
    doc_qa_data share), so every module can be read, and imported, on its own."""
    cycle = find_cycle(module_imports(package))
    assert not cycle, f"import cycle in {package}: {' -> '.join(cycle)}"


def test_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
