"""Helpers for the ingest / retrieval / search tests: a small document set and a second encoder
whose weights differ from ``tiny_mlm_dir`` (for the encoder-mismatch checks)."""

from __future__ import annotations

import shutil
from pathlib import Path

DOCS = {
    "files.md": "# Files\n\n## Reading\n\nTo read a file line by line, loop over the file object: "
    "for line in f. The readline method reads one line.\n\n## Writing\n\nUse write to store text "
    "in a file. Close it afterwards or use a with statement.\n",
    "errors.rst": "Errors\n======\n\nExceptions are raised when something goes wrong. Use try and "
    "except to handle an exception. The finally clause always runs.\n",
    "notes.txt": "Zebras and giraffes live in the savanna. The zebra has stripes.\n\nGiraffes are tall.\n",
    "page.html": "<html><head><style>p{}</style><script>var x=1;</script></head><body><h1>Web</h1>"
    "<p>HTML pages are parsed to text. Scripts are dropped.</p><h2>Links</h2><p>Anchors link "
    "pages together.</p></body></html>",
}


def write_docs(folder: Path, docs: dict[str, str] = DOCS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)  # names may hold folders
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def perturbed_copy(model_dir: Path, out: Path) -> Path:
    """A copy of a model folder with slightly different weights (a different fingerprint)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    for f in out.rglob("*.safetensors"):
        tensors = load_file(f)
        name = next(iter(tensors))
        tensors[name] = tensors[name] + 0.01
        save_file(tensors, f, metadata={"format": "pt"})
    return out


def listed_index(root: Path) -> Path:
    """An index folder that lists as an index (rag.storage.paths.list_indexes: a ``CURRENT`` naming a
    generation folder), for tests whose pipeline is scripted and never opens it; ``root``."""
    (root / "gen-000001").mkdir(parents=True, exist_ok=True)
    (root / "CURRENT").write_text("gen-000001\n", encoding="utf-8")
    return root
