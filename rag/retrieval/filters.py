"""Document filters of a search: ``--where path=library/*``, ``--where type=pdf``.

A filter is clauses ANDed; each clause is one key and one or more values ORed (``type=pdf,docx``):

- ``path=GLOB``: the document's path relative to the ingested folder (what results show,
  :func:`rag.storage.paths.display_source`), matched with :func:`fnmatch.fnmatchcase` (``*`` crosses
  folders: ``library/*`` is everything under ``library/``); a value without ``*?[`` names a
  document or a folder of documents (``library`` = ``library/*``), as ``rag.docs remove`` does;
- ``type=T``: the document's type (:func:`rag.documents.document_type`: ``md``, ``txt``,
  ``rst``, ``html``, ``pdf``, ``docx``); another value is refused, naming it.

The retriever turns a filter into the set of the generation's chunk ids it allows
(:meth:`rag.retrieval.retriever.Snapshot.allowed`), and the engine pushes that set into every
stage (the vector index searches only those ids, BM25 scores only those, the reranker sees only
their candidates), so ``k`` results come from the filtered documents whenever they hold ``k``.

A filter is bounded, whichever front end sends it (``--where``, ``rag.toml``, the API's
``rag.filter``, MCP's ``where``, the UI's box): at most :data:`MAX_CLAUSES` clauses,
:data:`MAX_VALUES` values in all and :data:`MAX_FILTER_CHARS` characters in all, else one
:class:`FilterError` saying which bound (an unbounded filter held an answer slot for its whole
evaluation: docs/security.md, *Filters without a bound*).

Why not each backend's metadata filter alone: FAISS has none, and Chroma's ``where`` on a
``source`` field would also match the chunks a previous generation of the same file left in the
shared collection; the id set is exactly this generation's chunks on every backend.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rag.documents import document_type

KEYS = ("path", "type")
TYPES = ("md", "txt", "rst", "html", "pdf", "docx")  # rag.documents.document_type's values
GLOB_CHARS = "*?["
MAX_CLAUSES = 16  # clauses of one filter (each ANDed; more say nothing a person means)
MAX_VALUES = 64  # values of all its clauses together (ORed within a clause)
MAX_FILTER_CHARS = 4096  # characters of all its clauses together


class FilterError(ValueError):
    """A filter that cannot be read; the message names the clause."""


def _path_matches(path: str, pattern: str) -> bool:
    if any(c in pattern for c in GLOB_CHARS):
        return fnmatch.fnmatchcase(path, pattern)
    folder = pattern.strip("/")
    return path == folder or path.startswith(folder + "/")


@dataclass(frozen=True)
class Where:
    """A parsed filter: ``clauses`` of (key, values), ANDed across clauses, ORed within one."""

    clauses: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.clauses)

    def matches(self, path: str, type_: str) -> bool:
        """Whether a document with relative ``path`` and type ``type_`` passes every clause."""
        for key, values in self.clauses:
            if key == "type" and type_ not in values:
                return False
            if key == "path" and not any(_path_matches(path, v) for v in values):
                return False
        return True

    def to_list(self) -> list[str]:
        """The clauses as ``key=v1,v2`` strings (what ``--where`` and ``rag.toml`` take)."""
        return [f"{key}={','.join(values)}" for key, values in self.clauses]

    @classmethod
    def parse(cls, spec: Any) -> Where:
        """A filter from what a user gives: None or empty (no filter), a :class:`Where`, one
        ``key=value`` string, a list of them (``--where``, ``rag.toml``, the API), or a mapping
        ``{key: value or [values]}`` (the API). :class:`FilterError` names a bad clause."""
        if spec is None:
            return cls()
        if isinstance(spec, Where):
            return spec
        if isinstance(spec, str):
            spec = [spec]
        if isinstance(spec, Mapping):
            items = []
            for key, value in spec.items():
                values = [value] if isinstance(value, str) else value
                if not isinstance(values, Sequence) or not all(isinstance(v, str) for v in values):
                    raise FilterError(f"filter {key!r} must be a string or a list of strings")
                items.append((str(key), list(values)))
        elif isinstance(spec, Sequence):
            items = []
            for clause in spec:
                if not isinstance(clause, str) or "=" not in clause:
                    raise FilterError(
                        f"--where {clause!r} is not KEY=VALUE (path=GLOB or type=pdf,md)"
                    )
                key, _, value = clause.partition("=")
                items.append((key, value.split(",")))
        else:
            raise FilterError(f"a filter is a list of KEY=VALUE strings, not {spec!r}")
        _check_size(items)
        return cls(tuple(_clause(key, values) for key, values in items))


def _check_size(items: list[tuple[Any, list[Any]]]) -> None:
    """Refuse a filter past :data:`MAX_CLAUSES`, :data:`MAX_VALUES` or :data:`MAX_FILTER_CHARS`
    (module docstring), before any clause is read."""
    if len(items) > MAX_CLAUSES:
        raise FilterError(
            f"a filter takes at most {MAX_CLAUSES} clauses (--where), not {len(items):,}"
        )
    values = sum(len(v) for _, v in items)
    if values > MAX_VALUES:
        raise FilterError(
            f"a filter takes at most {MAX_VALUES} values in all (--where), not {values:,}"
        )
    chars = sum(len(str(k)) + sum(len(str(x)) for x in v) for k, v in items)
    if chars > MAX_FILTER_CHARS:
        raise FilterError(
            f"a filter takes at most {MAX_FILTER_CHARS:,} characters in all (--where), "
            f"not {chars:,}"
        )


def _clause(key: str, values: list[str]) -> tuple[str, tuple[str, ...]]:
    key = key.strip().lower()
    if key not in KEYS:
        raise FilterError(f"--where key must be one of {', '.join(KEYS)}, not {key!r}")
    vals = [v.strip() for v in values if v.strip()]
    if not vals:
        raise FilterError(f"--where {key}= needs a value")
    if key == "type":
        vals = [document_type("x." + v.lower().lstrip(".")) for v in vals]  # markdown = md
        bad = [v for v in vals if v not in TYPES]
        if bad:
            raise FilterError(f"--where type must be one of {', '.join(TYPES)}, not {bad[0]!r}")
    return key, tuple(vals)
