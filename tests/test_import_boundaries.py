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


# Inside rag, by subpackage (docs/architecture.md): the command-line entry points are imported by
# no other module of the project packages below, so the server and the UI share model checks
# and settings through rag.config and rag.pipeline instead of CLI code; and ui talks to rag
# through its public face only: ``from rag import NAME`` for a NAME of rag's ``__all__``
# (rag/__init__.py), and the command-line plumbing every command shares (rag.cli: the parser,
# run_cli, the flag builder for the app's own settings), never to a rag module's insides.
ENTRY_POINTS = ("rag.ask", "rag.docs", "rag.mcp", "rag.search", "rag.serve.app")
UI_RAG_MODULES = ("rag.cli",)  # the modules ui may import, as a whole or below


def imported_modules(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import in ``source``, at any depth: ``import a.b``
    gives ``a.b``; ``from a.b import c`` gives ``a.b`` and ``a.b.c`` (``c`` may be a module).
    Relative imports stay inside the importing package and are not reported."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif (name := literal_import(node)) and not name.startswith("."):
            found.append((node.lineno, name))
    return found


def literal_import(node: ast.AST) -> str | None:
    """The module a call ``import_module("x.y")`` / ``__import__("x.y")`` names, else None."""
    if (
        isinstance(node, ast.Call)
        and _called_name(node.func) in ("import_module", "__import__")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


def imported_packages(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``source``, at any depth."""
    return sorted({(line, name.split(".")[0]) for line, name in imported_modules(source, filename)})


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
from training.finetune.lora import x
from . import sibling
from .cli import y
if TYPE_CHECKING:
    from ui.app import App

def f():
    import rag.evaluation.metrics
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


def _imports(package: str) -> list[tuple[str, int, str]]:
    """(file, line, dotted name) of every absolute import in ``package``'s files."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT)
        out += [
            (str(rel), line, name) for line, name in imported_modules(path.read_text(), str(rel))
        ]
    return out


def test_entry_points_are_imported_only_by_their_main():
    """``rag.ask``, ``rag.search`` and ``rag.serve.app`` are commands: no module of rag, ui,
    training or evals imports them (benchmarks drive them, tests call them), except the
    ``__main__.py`` beside one (``python -m rag.serve``)."""
    bad = []
    for package in ("rag", "ui", "training", "evals"):
        for rel, line, name in _imports(package):
            module = Path(name.replace(".", "/"))
            own_main = Path(rel) == module.parent / "__main__.py"
            if name in ENTRY_POINTS and not own_main:
                bad.append(f"{rel}:{line}: imports {name}")
    assert not bad, "entry points imported as libraries:\n" + "\n".join(bad)


def rag_public_names() -> set[str]:
    """The names of ``__all__`` in rag/__init__.py (a literal list, read with ``ast``)."""
    tree = ast.parse((ROOT / "rag" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("rag/__init__.py has no literal __all__")


def ui_rag_import_allowed(name: str, public: set[str]) -> bool:
    """Whether ui may import ``name`` (a dotted name from :func:`imported_modules`): ``rag``, a
    public name of it (``from rag import RAGConfig`` gives ``rag.RAGConfig``) or a module of
    :data:`UI_RAG_MODULES`."""
    if name == "rag" or any(name == m or name.startswith(m + ".") for m in UI_RAG_MODULES):
        return True
    top, _, rest = name.partition(".")
    return top == "rag" and rest in public


def test_ui_import_rule():
    public = {"RAGConfig", "list_indexes"}
    for name in ("rag", "rag.RAGConfig", "rag.cli", "rag.cli.flags.add_dataclass_args"):
        assert ui_rag_import_allowed(name, public), name
    for name in ("rag.config", "rag.config.RAGConfig", "rag.ingest", "rag.storage.paths"):
        assert not ui_rag_import_allowed(name, public), name


def test_ui_uses_the_public_face_of_rag():
    public = rag_public_names()
    bad = [
        f"{rel}:{line}: imports {name}"
        for rel, line, name in _imports("ui")
        if name.split(".")[0] == "rag" and not ui_rag_import_allowed(name, public)
    ]
    allowed = ", ".join(UI_RAG_MODULES)
    assert not bad, (
        f"ui may import from rag only the names of rag.__all__ (from rag import NAME) and "
        f"{allowed}:\n" + "\n".join(bad)
    )
