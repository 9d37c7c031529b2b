"""The public face of ``rag`` (rag/__init__.py): every name in ``rag.__all__`` resolves to the
object its module defines, lazily, so ``import rag`` (and ``import rag.cli``, which every command
line starts with) imports no torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import rag


@pytest.mark.parametrize("name", rag.__all__)
def test_every_public_name_resolves(name):
    value = getattr(rag, name)
    module = importlib.import_module(rag._SOURCES[name])
    assert value is getattr(module, name)
    assert name in dir(rag)


def test_all_and_sources_agree():
    assert sorted(rag.__all__) == sorted(rag._SOURCES)
    with pytest.raises(AttributeError):
        rag.no_such_name  # noqa: B018


def test_submodules_keep_their_names():
    """``rag.ingest`` is the package (the keyword form of ingest is rag.ingest.ingest), and the
    entry points import as modules."""
    from rag import ask, ingest, search

    assert ingest.__name__ == "rag.ingest" and callable(ingest.ingest)
    assert ask.__name__ == "rag.ask" and search.__name__ == "rag.search"


@pytest.mark.parametrize("statement", ["import rag", "import rag.cli", "from rag import __all__"])
def test_importing_the_package_is_light(statement):
    heavy = "sorted(m for m in ('torch', 'transformers') if m in sys.modules)"
    code = f"{statement}\nimport sys\nprint({heavy})"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", f"{statement} imported {out.strip()}"
