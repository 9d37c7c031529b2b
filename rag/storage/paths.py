"""Where generated artefacts live: ``$RAG_HOME`` or ``artifacts/`` at the project root.

Layout (see docs/architecture.md)::

    artifacts/tokenizer/          AutoTokenizer folder
    artifacts/models/<name>/      HF folder + run.json + train_log.jsonl + loss.png
    artifacts/indexes/<name>/     manifest, vectors, BM25, chunks
    artifacts/evals/<run>/        results.json, tables, plots
    artifacts/cache/              tokenised corpora, corpus embeddings (safe to delete)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

_PROJECT_ROOT = Path(__file__).resolve().parents[2]


def rag_home() -> Path:
    """The artefact root: ``$RAG_HOME`` if set, else ``artifacts/`` beside pyproject.toml
    (or under the working directory when the package is installed elsewhere)."""
    env = os.environ.get("RAG_HOME")
    if env:
        return Path(env).expanduser()
    if (_PROJECT_ROOT / "pyproject.toml").exists():
        return _PROJECT_ROOT / "artifacts"
    return Path.cwd() / "artifacts"


def models_dir() -> Path:
    return rag_home() / "models"


def indexes_dir() -> Path:
    return rag_home() / "indexes"


def cache_dir() -> Path:
    """Derived data that is recomputed when missing (tokenised corpora, corpus embeddings,
    probes): ``$RAG_HOME/cache``; deleting it only costs time."""
    return rag_home() / "cache"


# The file in an index folder that names its published generation (rag.storage.manifest re-exports it).
CURRENT = "CURRENT"


def list_indexes() -> list[str]:
    """The indexes under ``$RAG_HOME/indexes`` (the server's models, the UI's dropdown): the
    folders that hold a ``CURRENT`` pointer, i.e. have published a generation. A folder a first
    ingest is still writing, or one a killed first ingest left with only its ``.lock``, is no
    index yet. A damaged pointer is still listed, so using the index reports the damage
    (:func:`rag.storage.manifest.current_generation`) rather than "does not exist"."""
    root = indexes_dir()
    if not root.is_dir():
        return []
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / CURRENT).is_file()
    )


# An index is named, never addressed by a path: a name cannot climb out of $RAG_HOME/indexes
# ("../../escape"), land on a hidden folder or read as a flag. Letters, digits, '.', '_', '-';
# not '.' or '-' first; at most 100 characters. The one rule for the CLIs (--index), rag.toml
# and the UI's index setting.
_INDEX_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")


class IndexNameError(ValueError):
    """An index name that is not a plain name (a path, a hidden name, odd characters)."""


CLI_INDEX_HINT = "a folder elsewhere is given with --index-dir PATH"


def check_index_name(name: str, hint: str = CLI_INDEX_HINT) -> str:
    """``name`` when it is a plain index name, else :class:`IndexNameError` naming it.

    Paths are refused rather than "cleaned": a folder outside ``$RAG_HOME/indexes`` is given
    explicitly (``--index-dir PATH`` on the command line, a :class:`~pathlib.Path` in Python).
    ``hint`` ends the message (the UI, which has no --index-dir, passes its own)."""
    if not isinstance(name, str) or not _INDEX_NAME.match(name) or ".." in name:
        raise IndexNameError(
            f"index name {name!r} is not allowed: use letters, digits, '.', '_' or '-' "
            "(not '.' or '-' first, no '/')" + (f"; {hint}" if hint else "")
        )
    return name


def check_existing_index(name: str, hint: str = CLI_INDEX_HINT) -> str:
    """``name`` when it is a plain name (:func:`check_index_name`) of an index folder under
    :func:`indexes_dir`, else the error naming it and how to create it (the servers' start-up
    check: rag.serve, rag.mcp)."""
    check_index_name(name, hint=hint)
    if name not in list_indexes():
        raise LookupError(
            f"index {name!r} does not exist under {indexes_dir()}: "
            f"create it with python -m rag.ingest FOLDER --index {name}"
        )
    return name


def index_path(name: str) -> Path:
    """The folder of the index called ``name`` under :func:`indexes_dir` (name checked)."""
    return indexes_dir() / check_index_name(name)


def display_source(source: str, roots: Iterable[str]) -> str:
    """``source`` as the user knows it: relative to the broadest ingested folder that holds it
    (``library/io.rst.txt``), or its file name when it was ingested as a single file or lies
    under no recorded root. Never the machine's absolute path: citations, search results and
    the UI show this, while the manifest keeps absolute keys for incremental re-ingest."""
    best: str | None = None
    best_len = -1
    for root in roots:
        prefix = root if root.endswith(os.sep) else root + os.sep
        if source.startswith(prefix) and (best is None or len(root) < best_len):
            best, best_len = source[len(prefix) :], len(root)
    return best or os.path.basename(source) or source


def display_names(sources: Iterable[str], roots: Iterable[str]) -> dict[str, str]:
    """Each of ``sources`` as :func:`display_source` shows it, made distinct: documents of two
    ingested folders that share a relative path (``dupA/same.md`` and ``dupB/same.md``, both
    ``same.md``) are shown with as much of their folder as tells them apart
    (``dupA/same.md``, ``dupB/same.md``; ``x/docs/same.md`` for two folders called ``docs``).
    Two documents listed, cited and removed as one ``same.md`` (the API removed both, MCP served
    one under both URIs) was the alternative. A name no other document shares stays as it was.
    One mapping for every place that names documents: listings and removals
    (:mod:`rag.ingest.manage`), search results, citations and filters (the retriever), MCP."""
    roots = list(roots)
    names = {s: display_source(s, roots) for s in sources}
    groups: dict[str, list[str]] = {}
    for source, name in names.items():
        groups.setdefault(name, []).append(source)
    taken = set(names.values())
    for name, group in groups.items():
        if len(group) < 2:
            continue
        # the folder each one's name is relative to, its parts nearest first
        anchors = {s: s[: len(s) - len(name)].rstrip(os.sep).split(os.sep)[::-1] for s in group}
        deepest = max(len(parts) for parts in anchors.values())
        for depth in range(1, deepest + 1):
            shown = {
                s: "/".join([*reversed([p for p in parts[:depth] if p]), name])
                for s, parts in anchors.items()
            }
            distinct = len(set(shown.values())) == len(group)
            if distinct and not (set(shown.values()) & (taken - {name})):
                break
        names.update(shown)
        taken |= set(shown.values())
    return names


def earlier_display_name(asked: str, source: str, roots: Iterable[str]) -> bool:
    """Whether ``asked`` is the root-qualified name :func:`display_names` gives ``source``
    beside a document of the same relative path from another of ``roots`` (the manifest's
    recorded roots): ``dupB/same.md`` for ``dupB``'s ``same.md``, the name it had until
    ``dupA/same.md`` was removed and it became ``same.md``. Only such names are taken, never
    an arbitrary tail of the server's path, so nothing more of a folder's path can be told
    from the answer than the listing showed while both documents were there."""
    roots = list(roots)
    name = display_source(source, roots)
    if not asked.endswith("/" + name):
        return False
    for root in roots:
        # the same-named document that root held: under it (a folder), or it (a single file)
        for other in (root.rstrip(os.sep) + os.sep + name, root):
            if other != source and display_names([source, other], roots)[source] == asked:
                return True
    return False


# What printable() escapes: C0 and C1 controls and DEL (a newline forges a line of a report, an
# ESC starts a terminal sequence), the Unicode line and paragraph separators, the bidirectional
# embeddings, overrides and isolates (they reorder how the rest of a line reads), and the lone
# surrogates that stand for a name's undecodable bytes (printing one would raise).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if "\udc80" <= ch <= "\udcff":  # an undecodable byte of a file name (os.fsdecode)
        return f"\\x{ord(ch) - 0xDC00:02x}"
    return ch.encode("unicode_escape", "backslashreplace").decode("ascii")


def printable(text: str | os.PathLike[str]) -> str:
    """``text`` (a path, a file name, a line naming one) with control characters escaped as
    Python writes them (``\\n``, ``\\x1b``, ``\\u202e``; an undecodable byte of a name as
    ``\\xff``), so whatever a file is called it reads as one name on one line: every path shown
    to people goes through it (ingest's report, ``rag.search``, ``rag.docs list``, ``rag.ask``'s
    sources, the CLIs' one failure line). JSON output keeps the real name (JSON escapes it)."""
    return _UNPRINTABLE.sub(_escape, os.fspath(text))


def tokenizer_dir() -> Path:
    return rag_home() / "tokenizer"


def shared_data_dir() -> Path | None:
    """``../shared/data`` beside the checkout (or ``$RAG_SHARED_DATA``), if it exists."""
    env = os.environ.get("RAG_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates += [_PROJECT_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    return None
