"""What a search query must hold: at least one word.

An empty or punctuation-only query (``""``, ``"???"``, ``"..."``) gives BM25 no term to match
and the encoder nothing to mean, so every passage scores alike and the "hits" are arbitrary
(hybrid search ranked them all at 0.50). It is refused instead, by the one check every front end
uses: ``rag.search`` and ``Retriever.search`` (and so the MCP ``search`` tool), the pipeline's
question (``rag.ask``, the UI, ``rag.serve``, which answers it with a 400).
"""

from __future__ import annotations


def check_query(text: str, what: str = "query") -> str:
    """``text`` when it holds a word (a letter or a digit, in any script), else ValueError
    naming ``what`` and the text (the CLIs: one line, exit status 2)."""
    if not any(ch.isalnum() for ch in text):
        shown = repr(text[:40]) if text.strip() else "empty"
        raise ValueError(f"the {what} has no word to search for ({shown})")
    return text
