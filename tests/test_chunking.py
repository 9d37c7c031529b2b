"""Chunking invariants: token limit, coverage, offsets, overlap, heading paths, stable ids."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from rag.documents import Document, markdown_headings
from rag.documents.chunking import chunk_document, count_tokens, indexed_text
from rag.models import minilm_path
from rag.types import Chunk


@pytest.fixture(scope="module")
def wordpiece():
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def bpe(tiny_tokenizer_dir):
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def make_doc(seed: int = 0, n_sections: int = 6) -> Document:
    """Markdown with headings, prose, a code block, a long unpunctuated run and long words."""
    rng = random.Random(seed)
    words = [
        "file",
        "read",
        "line",
        "open",
        "close",
        "python",
        "data",
        "index",
        "chunk",
        "token",
        "encoder",
        "query",
        "answer",
    ]
    parts = ["# Guide", "", "Intro sentence about files. Another one here!", ""]
    for s in range(n_sections):
        parts += [f"## Section {s}", ""]
        for _ in range(rng.randint(1, 6)):
            sent = [
                " ".join(rng.choices(words, k=rng.randint(4, 25))).capitalize() + "."
                for _ in range(rng.randint(1, 8))
            ]
            parts += [" ".join(sent), ""]
        if s % 2:
            parts += [
                "```",
                *(f"    x{i} = read_line(f{i})" for i in range(rng.randint(5, 40))),
                "```",
                "",
            ]
        if s % 3 == 0:
            parts += [" ".join(rng.choices(words, k=600)), ""]  # no punctuation at all
            parts += ["".join(rng.choices("abcdefghij", k=3000)), ""]  # one enormous 'word'
    text = "\n".join(parts)
    return Document(path="/docs/guide.md", text=text, headings=markdown_headings(text))


@pytest.mark.parametrize("tok_name", ["wordpiece", "bpe"])
@pytest.mark.parametrize("chunk_tokens,overlap", [(64, 8), (128, 32), (512, 0)])
def test_chunks_never_exceed_limit_and_cover_text(request, tok_name, chunk_tokens, overlap):
    tok = request.getfixturevalue(tok_name)
    doc = make_doc(seed=chunk_tokens)
    max_tokens = 100
    chunks = chunk_document(
        doc, tok, chunk_tokens=chunk_tokens, overlap=overlap, max_tokens=max_tokens
    )
    assert chunks
    limit = min(chunk_tokens, max_tokens)
    counts = count_tokens(tok, [c.text for c in chunks])
    assert max(counts) <= limit
    covered = [False] * len(doc.text)
    for c in chunks:
        assert doc.text[c.start : c.end] == c.text
        assert c.source == doc.path
        for i in range(c.start, c.end):
            covered[i] = True
    missing = [i for i, ch in enumerate(doc.text) if not ch.isspace() and not covered[i]]
    assert not missing, doc.text[missing[0] : missing[0] + 40]
    assert len({c.id for c in chunks}) == len(chunks)


def test_default_limit_is_encoder_max(wordpiece):
    doc = make_doc(seed=3)
    chunks = chunk_document(doc, wordpiece, chunk_tokens=10_000, overlap=0)
    assert max(count_tokens(wordpiece, [c.text for c in chunks])) <= wordpiece.model_max_length - 2


def test_overlap_between_consecutive_chunks_of_a_section(wordpiece):
    text = "# T\n\n" + " ".join(f"word{i}." for i in range(400))
    doc = Document("/d.md", text, markdown_headings(text))
    chunks = chunk_document(doc, wordpiece, chunk_tokens=64, overlap=16)
    assert len(chunks) > 3
    for a, b in zip(chunks, chunks[1:]):
        assert b.start < a.end, "consecutive chunks should share their overlap"
        assert b.start > a.start
    no_overlap = chunk_document(doc, wordpiece, chunk_tokens=64, overlap=0)
    assert all(b.start >= a.end for a, b in zip(no_overlap, no_overlap[1:]))


def test_prefers_paragraph_then_sentence_boundaries(wordpiece):
    para = "This is a sentence about reading files. " * 6
    text = "\n\n".join(para.strip() for _ in range(8))
    doc = Document("/d.txt", text, [])
    chunks = chunk_document(doc, wordpiece, chunk_tokens=120, overlap=0)
    for c in chunks[:-1]:
        assert c.text.endswith("."), repr(c.text[-30:])
    assert text[chunks[1].start - 2 : chunks[1].start] == "\n\n"


def test_heading_paths_and_sections(wordpiece):
    text = "# A\n\nalpha text here.\n\n## B\n\nbeta text here.\n\n# C\n\ngamma text " + "more " * 80
    doc = Document("/d.md", text, markdown_headings(text))
    chunks = chunk_document(doc, wordpiece, chunk_tokens=16, overlap=0)
    by_word = {w: c.heading_path for c in chunks for w in ("alpha", "beta", "gamma") if w in c.text}
    assert by_word == {"alpha": ("A",), "beta": ("A", "B"), "gamma": ("C",)}
    assert not any("alpha" in c.text and "gamma" in c.text for c in chunks)


def test_ids_are_stable_and_change_with_content(wordpiece):
    doc = make_doc(seed=1)
    a = chunk_document(doc, wordpiece, 64, 8)
    b = chunk_document(make_doc(seed=1), wordpiece, 64, 8)
    assert [c.id for c in a] == [c.id for c in b]
    changed = Document(doc.path, doc.text + "\n\nnew paragraph.", markdown_headings(doc.text))
    assert not {c.id for c in a} & {c.id for c in chunk_document(changed, wordpiece, 64, 8)}
    other = Document("/other.md", doc.text, doc.headings)
    assert not {c.id for c in a} & {c.id for c in chunk_document(other, wordpiece, 64, 8)}


def test_bad_settings_raise(wordpiece):
    doc = make_doc()
    with pytest.raises(ValueError, match="overlap"):
        chunk_document(doc, wordpiece, chunk_tokens=64, overlap=40)
    with pytest.raises(ValueError, match="too small"):
        chunk_document(doc, wordpiece, chunk_tokens=4, overlap=0)


class CountingHeadings(list):
    """A document's headings that count how many times chunking visits one, and stop it once
    that passes ``limit`` (a scan per chunk visits about chunks x headings)."""

    def __init__(self, items, limit: int) -> None:
        super().__init__(items)
        self.visits, self.limit = 0, limit

    def __iter__(self):
        for h in super().__iter__():
            self.visits += 1
            if self.visits > self.limit:
                raise AssertionError(f"over {self.limit} heading visits: not linear")
            yield h

    def __getitem__(self, i):
        self.visits += 1
        return super().__getitem__(i)


def test_chunking_is_linear_in_the_headings(wordpiece):
    """Issue 47, case 6: a .md of 200k `# h` lines (800 KB) took 356 s and 0.92 GB, since
    Document.heading_path_at scanned every heading for every chunk. Now the heading paths are
    built in one pass and found by bisection: a bounded number of visits, whatever the count."""
    n = 200_000
    text = "# h\n" * n + "\nThe end of the file.\n"
    headings = markdown_headings(text)
    assert len(headings) == n
    doc = Document("/d.md", text, CountingHeadings(headings, limit=5 * n))
    chunks = chunk_document(doc, wordpiece, chunk_tokens=64, overlap=8)
    assert len(chunks) > 1000 and doc.headings.visits <= 5 * n
    assert chunks[-1].heading_path == ("h",) and "The end" in chunks[-1].text
    # the same answers as the scan it replaces
    plain = Document("/d.md", "# A\nx\n## B\ny\n# C\nz\n", [])
    plain.headings = markdown_headings(plain.text)
    assert [plain.heading_path_at(i) for i in (0, 4, 6, 11, 13, 17)] == [
        ("A",),
        ("A",),
        ("A", "B"),
        ("A", "B"),
        ("C",),
        ("C",),
    ]


def test_a_flood_of_bare_headings_fills_chunks_to_the_budget(wordpiece):
    """Issue 47, case 6: 200,000 bare `# h` headings were 12,500 chunks of 32 tokens, every
    one embedded. A run of tiny sections now joins up to the chunk budget; a tiny section before
    an ordinary one still joins that one, and the chunks still cover every heading."""
    from rag.documents.chunking import _merge_small

    text = "# h\n" * 20_000
    chunks = chunk_document(
        Document("/d.md", text, markdown_headings(text)), wordpiece, chunk_tokens=256, overlap=0
    )
    tokens = count_tokens(wordpiece, [c.text for c in chunks])
    assert max(tokens) <= 256 and sum(tokens) == 2 * 20_000  # "#" and "h" per line
    assert len(chunks) <= 2 * 20_000 // 256 + 2  # full chunks, not budget / 8 ones
    # ranges are (first token, end token); budget 64 -> tiny is under 8 tokens
    assert _merge_small([(0, 3), (3, 40)], 64) == [(0, 40, 3)]  # a bare heading joins its body
    assert _merge_small([(0, 3), (3, 6), (6, 9), (9, 60)], 64) == [(0, 9, 6), (9, 60, 9)]
    run = [(i, i + 3) for i in range(0, 300, 3)]  # 100 tiny sections of 3 tokens
    merged = _merge_small(run, 64)
    assert [m[1] - m[0] for m in merged[:-1]] == [63] * (len(merged) - 1)
    assert merged[0][0] == 0 and merged[-1][1] == 300
    assert all(a[1] == b[0] for a, b in zip(merged, merged[1:]))


def test_tokenising_in_pieces_gives_the_offsets_of_the_whole_text(wordpiece, bpe, monkeypatch):
    """A document is tokenised in pieces cut where no tokenizer joins the two sides (the whole
    encoding of 1,000,000 bare headings held 1.1 GB): the offsets are those of one call on the
    whole text, for WordPiece and byte-level BPE, on prose, code, tables and indented lines."""
    import re

    import rag.documents.chunking as C

    table = "\n".join(f"   | cell {i}   | :c:type:`T{i}`   |" for i in range(40))
    text = re.sub(r"[a-j]{3000}", "", make_doc(3, n_sections=12).text) + "\n" + table + "\n"
    monkeypatch.setattr(C, "PIECE_CHARS", 2000)  # about 20 pieces
    for tok in (wordpiece, bpe):
        backend = C._backend(tok)
        whole = [o for o in backend.encode(text, add_special_tokens=False).offsets if o[1] > o[0]]
        assert C._token_offsets(backend, text) == whole
    assert C._piece_end("word " * 100, 0, 300) < 300  # a cut between two words
    assert C._piece_end("x" * 1000, 0, 300) == 300  # no place to cut: inside the run


def test_a_text_over_the_token_bound_is_refused_before_it_is_read_whole(wordpiece, monkeypatch):
    """Issue 47, case 6 of distinct text: a 9.9 MB file of 1,000,000 distinct headings was
    chunked and embedded for ten minutes. A text of more than ``max_file_tokens`` tokens is
    refused while it is tokenised: the pieces after the one that passed the bound are never
    read, and a text of exactly the bound is chunked as before."""
    import rag.documents.chunking as C
    from rag.documents import DocumentError

    monkeypatch.setattr(C, "PIECE_CHARS", 2000)
    text = "".join(f"# h{i}\n" for i in range(20_000))  # about 140 pieces
    doc = Document(text=text, path="heads.md", headings=markdown_headings(text))
    total = len(C._token_offsets(C._backend(wordpiece), text))
    read: list[int] = []
    backend = C._backend(wordpiece)
    real = backend.encode

    class Counting:  # the backend, counting the characters it is given
        def encode(self, piece, **kw):
            read.append(len(piece))
            return real(piece, **kw)

    monkeypatch.setattr(C, "_backend", lambda tok: Counting())
    with pytest.raises(DocumentError, match=r"heads.md: more than 1,000 tokens to embed"):
        chunk_document(doc, wordpiece, 64, 8, max_file_tokens=1000)
    assert sum(read) < len(text) / 10  # stopped after a few pieces of about 140
    monkeypatch.setattr(C, "_backend", lambda tok: backend)
    exact = chunk_document(doc, wordpiece, 64, 8, max_file_tokens=total)
    assert exact == chunk_document(doc, wordpiece, 64, 8)
    with pytest.raises(DocumentError, match=f"more than {total - 1:,} tokens"):
        chunk_document(doc, wordpiece, 64, 8, max_file_tokens=total - 1)


def test_a_run_without_spaces_is_cut_inside(wordpiece, bpe):
    """Issue 47, case 10: 15,000,000 characters without a space were one chunk (WordPiece reads
    a word over 100 characters as one [UNK]); every question then took 53 s and 2 GB. Now
    whatever the text a chunk is at most the budget in tokens and MAX_TOKEN_CHARS characters per
    token of it, and the chunks still cover the text."""
    from rag.documents.chunking import MAX_TOKEN_CHARS

    text = "# Blob\n\n" + "a" * 200_000 + "\n\nAfter the blob.\n"
    doc = Document("/blob.md", text, markdown_headings(text))
    for tok in (wordpiece, bpe):
        chunks = chunk_document(doc, tok, chunk_tokens=64, overlap=8, max_tokens=100)
        assert len(chunks) >= 200_000 // (64 * MAX_TOKEN_CHARS)
        assert max(len(c.text) for c in chunks) <= 64 * MAX_TOKEN_CHARS
        assert max(count_tokens(tok, [c.text for c in chunks])) <= 64
        covered = sum(c.end - c.start for c in chunks)
        assert covered >= len(text.strip()) - 16 and "After the blob." in chunks[-1].text


def test_indexed_text_names_the_file_and_its_headings():
    chunk = Chunk(
        id="c",
        text="Return the base name.",
        source="/docs/library/os.path.rst.txt",
        heading_path=("os.path — Common pathname manipulations", "Functions"),
    )
    assert indexed_text(chunk) == (
        "os.path › os.path — Common pathname manipulations › Functions\nReturn the base name."
    )
    assert indexed_text(chunk, context=False) == "Return the base name."
    bare = Chunk(id="d", text="Some words.", source="/docs/NOTES")
    assert indexed_text(bare) == "NOTES\nSome words."
    assert indexed_text(Chunk(id="e", text="x", source="/docs/.md")) == ".md\nx"
