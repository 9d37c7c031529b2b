"""Documents: files → clean text + headings, within limits; then heading-aware token chunks.

- :mod:`rag.documents.walk`: which files a folder holds (supported suffixes, links, names that
  are not UTF-8, folders that cannot be listed) and a file's type;
- :mod:`rag.documents.limits`: :class:`Limits`, the per-file :class:`Deadline`, the zip-bomb
  checks, :class:`DocumentError` and :func:`failure_reason`;
- :mod:`rag.documents.html`: the linear HTML scanner;
- :mod:`rag.documents.loaders`: :class:`Document`, text cleaning, headings, the format loaders,
  :func:`load_document` and :func:`load_documents`;
- :mod:`rag.documents.chunking`: heading-aware token chunks (imported from there).

The names below are re-exported so ``from rag.documents import load_document`` reads as before;
a test that replaces a name the loaders look up patches the module that defines it.
"""

from __future__ import annotations

from rag.documents.limits import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILE_TOKENS,
    DEFAULT_MAX_PAGES,
    DEFAULT_MAX_SECONDS,
    DEFAULT_MAX_TEXT_CHARS,
    MAX_REASON_CHARS,
    PDF_CHECK_EVERY,
    ZIP_EXPANSION,
    ZIP_MAX_RATIO,
    ZIP_RATIO_FLOOR,
    Deadline,
    DocumentError,
    Limits,
    UnreadableFolderError,
    check_zip,
    failure_reason,
)
from rag.documents.loaders import (
    Document,
    Heading,
    clean_text,
    load_document,
    load_documents,
    markdown_headings,
    rst_headings,
)
from rag.documents.walk import (
    HTML_SUFFIXES,
    SOURCE_OF_PAGE,
    SUPPORTED_SUFFIXES,
    TEXT_SUFFIXES,
    ZIP_SUFFIXES,
    document_type,
    iter_files,
    sources_of_pages,
    undecodable_name,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILE_TOKENS",
    "DEFAULT_MAX_PAGES",
    "DEFAULT_MAX_SECONDS",
    "DEFAULT_MAX_TEXT_CHARS",
    "HTML_SUFFIXES",
    "MAX_REASON_CHARS",
    "PDF_CHECK_EVERY",
    "SOURCE_OF_PAGE",
    "SUPPORTED_SUFFIXES",
    "TEXT_SUFFIXES",
    "ZIP_EXPANSION",
    "ZIP_MAX_RATIO",
    "ZIP_RATIO_FLOOR",
    "ZIP_SUFFIXES",
    "Deadline",
    "Document",
    "DocumentError",
    "Heading",
    "Limits",
    "UnreadableFolderError",
    "check_zip",
    "clean_text",
    "document_type",
    "failure_reason",
    "iter_files",
    "sources_of_pages",
    "load_document",
    "load_documents",
    "markdown_headings",
    "rst_headings",
    "undecodable_name",
]
