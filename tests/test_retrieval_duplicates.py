"""Near-duplicate hits (rag.retrieval.duplicates): one text met twice among a search's best
candidates is returned once, the better-ranked copy, and the search still returns k hits."""

from __future__ import annotations

import pytest

from rag.retrieval.duplicates import check_dedup, containment, distinct, trigrams
from rag.retrieval.retriever import CorpusRetriever
from rag.retrieval.settings import RetrievalSettings

MD = (
    "## `fs.mkdir(path[, options], callback)`\n\nAsynchronously creates a directory. Set "
    "`recursive: true` to create the [parent directories][] too; the callback gets the first "
    "directory path created."
)
HTML = (
    "fs.mkdir(path[, options], callback) #\n\nAsynchronously creates a directory. Set "
    "recursive: true to create the parent directories too; the callback gets the first "
    "directory path created.\n\nAdded in: v0.1.8"
)
OTHER = "fs.rmdir removes a directory; with recursive: true it removes the parent directories."


def test_markup_does_not_tell_copies_apart_but_other_text_does():
    assert containment(trigrams(MD), trigrams(HTML)) == 1.0  # the markdown's every trigram
    assert containment(trigrams(MD), trigrams(OTHER)) < 0.2
    assert containment(frozenset(), trigrams(MD)) == 0.0
    assert trigrams("Hi") == frozenset({("hi",)})


def test_distinct_keeps_the_better_copy_in_order_and_checks_only_what_is_needed():
    row = ["md", "other", "html", "third"]
    text = {"md": MD, "other": OTHER, "html": HTML, "third": "Yet another sentence here."}
    assert distinct(row, text.get) == ["md", "other", "third"]
    assert distinct(["html", "md", "other"], text.get) == ["html", "other"]
    assert distinct(row, text.get, threshold=1.01) == row  # nothing is that similar
    # past the first `need` distinct items, the row follows unchecked
    assert distinct(row, text.get, need=1) == row
    assert distinct(row, text.get, need=2) == ["md", "other", "html", "third"][:2] + [
        "html",
        "third",
    ]


def test_a_search_returns_k_distinct_hits_from_a_folder_with_a_copied_page():
    ids = ["fs.md#1", "fs.html#1", "fs.md#2", "fs.html#2", "path.md#1"]
    texts = [
        MD,
        HTML,
        "fs.rmdir removes a directory; with recursive it removes the directories under it too.",
        "fs.rmdir removes a directory; with recursive it removes the directories under it too.",
        "path.dirname returns the directory name of a path, like the Unix dirname command.",
    ]
    query = "create a directory and its parent directories recursive"
    plain = CorpusRetriever(ids, texts, None, RetrievalSettings(mode="bm25", dedup=None))
    both = [i for i, _ in plain.search(query, k=3)]
    assert {"fs.md#1", "fs.html#1"} <= set(both)  # without it, two of three say one thing
    deduped = CorpusRetriever(ids, texts, None, RetrievalSettings(mode="bm25"))
    hits = [i for i, _ in deduped.search(query, k=3)]
    assert len(hits) == 3 and hits[0] == both[0]
    assert not {"fs.md#1", "fs.html#1"} <= set(hits)
    assert not {"fs.md#2", "fs.html#2"} <= set(hits)
    assert "path.md#1" in hits


@pytest.mark.parametrize("bad", [0, -0.5, 1.5])
def test_dedup_is_a_share_or_none(bad):
    check_dedup(None)
    check_dedup(1.0)
    with pytest.raises(ValueError, match="--dedup"):
        RetrievalSettings(dedup=bad)
    with pytest.raises(ValueError, match="--dedup"):
        check_dedup(bad)
