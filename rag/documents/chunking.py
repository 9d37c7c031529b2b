"""Token-aware chunking: split on headings, then paragraphs, then sentences, with overlap.

The document is tokenised once with the encoder's own (fast) tokenizer. The tokens' character
offsets let us cut each heading section at a token budget, preferring in order a paragraph
break, a sentence end, a line break, then any space. The next chunk starts ``overlap`` tokens
before the previous one ended (moved to a word start). Chunks near the budget are re-tokenised
on their own and cut again if the tokenizer disagrees at the edges, so a chunk never exceeds the
encoder's maximum sequence length.

Whatever the text, a chunk is also bounded in characters: a token that covers more than
:data:`MAX_TOKEN_CHARS` characters (a WordPiece tokenizer reads a run of more than 100 letters
without a space or punctuation as one ``[UNK]``: 15,000,000 such characters were one chunk, and
every question on that index then took 53 s and 2 GB) counts as one token per
:data:`MAX_TOKEN_CHARS` characters and may be cut inside. Chunking is linear in the document
(heading paths by bisection, :meth:`rag.documents.Document.heading_path_at`), and a caller's
``deadline`` (the file's ``--max-load-seconds``) is checked as it goes, as is its token bound
(``--max-file-tokens``: tokenising stops once the text holds more, before any chunk exists).

Why hand-written: LangChain's splitters count characters or tokens but drop the heading path
and character offsets that citations need, and cannot honour the encoder's exact token limit.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_left
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from rag.defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP
from rag.documents.limits import DocumentError
from rag.documents.loaders import Document
from rag.documents.walk import SUPPORTED_SUFFIXES
from rag.types import Chunk

# Boundary strength: higher is a better place to cut.
_BOUNDARIES = (
    (4, re.compile(r"\n\s*\n[ \t]*")),  # paragraph break
    (3, re.compile(r"(?<=[.!?:;])[\"')\]]*\s+")),  # sentence end
    (2, re.compile(r"\n[ \t]*")),  # line break (code, lists)
    (1, re.compile(r"\s+")),  # any space
)
_MIN_SECTION_FRACTION = 8  # sections under chunk_tokens/8 tokens (a bare heading) join the next
# The characters one token may stand for in a chunk's budget: longer tokens (an [UNK] for a run
# without spaces) count as several and may be cut inside (module docstring). Ordinary subword
# tokens are under 20 characters; a chunk is then at most budget * 32 characters.
MAX_TOKEN_CHARS = 32
CHECK_EVERY = 64  # chunks (or sections) between two deadline checks
PIECE_CHARS = 1 << 16  # characters tokenised per call (_token_offsets)
_SPACE_BETWEEN_WORDS = re.compile(r"(?<=\w)[ \t]+(?=\w)")
_backends: dict[int, tuple[Any, Any]] = {}


def _backend(tokenizer):
    """A private copy of the fast tokenizer's backend without padding/truncation state."""
    key = id(tokenizer)
    cached = _backends.get(key)
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    from tokenizers import Tokenizer

    if not getattr(tokenizer, "is_fast", False):
        raise TypeError("chunking needs a fast (Rust) tokenizer with character offsets")
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    _backends[key] = (tokenizer, backend)
    return backend


def special_tokens(tokenizer) -> int:
    """How many special tokens ([CLS], [SEP], ...) the encoder adds to one sequence."""
    return tokenizer.num_special_tokens_to_add(pair=False)


def count_tokens(tokenizer, texts: list[str]) -> list[int]:
    """Token counts without special tokens, in one batched call."""
    return [len(e.ids) for e in _backend(tokenizer).encode_batch(texts, add_special_tokens=False)]


def token_offsets(tokenizer, texts: list[str]) -> list[list[tuple[int, int]]]:
    """Each text's token character offsets, the model's special tokens included (as ``(0, 0)``),
    untruncated, in one batched call on the private backend copy: no padding or truncation
    state is set, so it is safe beside other threads encoding with the same tokenizer."""
    return [list(e.offsets) for e in _backend(tokenizer).encode_batch(texts)]


def _token_offsets(backend, text: str, limit: int | None = None) -> list[tuple[int, int]]:
    """The character offsets of ``text``'s tokens (empty ones dropped), read in pieces of about
    :data:`PIECE_CHARS` characters cut after a line break that a non-space character follows,
    where no tokenizer joins the two sides. Why not in one call: the fast tokenizer's encoding of
    a whole document holds about 550 bytes per token (ids, token strings, masks), 1.1 GB for the
    2M tokens of 1,000,000 bare headings; the offsets alone are kept here. With ``limit``, the
    reading stops at the first piece that takes the count past it (the caller refuses the
    text)."""
    out: list[tuple[int, int]] = []
    a, n = 0, len(text)
    while a < n and (limit is None or len(out) <= limit):
        b = n if n - a <= PIECE_CHARS else _piece_end(text, a, a + PIECE_CHARS)
        enc = backend.encode(text[a:b], add_special_tokens=False)
        out.extend((s + a, e + a) for s, e in enc.offsets if e > s)
        a = b
    return out


def _piece_end(text: str, a: int, b: int) -> int:
    """Where a piece of ``text[a:b]`` may end: after its last line break that a non-space
    character follows, else where its last run of spaces between two word characters starts
    (the run goes with the word after it, as byte-level BPE reads " word"; punctuation may take
    the line breaks after it), else ``b`` (no such place: cut inside, as
    :func:`_split_long_tokens` would)."""
    i = text.rfind("\n", a, b - 1)
    while i > a and text[i + 1].isspace():
        i = text.rfind("\n", a, i)
    if i > a:
        return i + 1
    last = None
    for m in _SPACE_BETWEEN_WORDS.finditer(text, a, b):
        last = m
    return last.start() if last is not None and last.start() > a else b


def _split_long_tokens(offsets: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """``offsets`` with every token longer than ``limit`` characters cut into pieces of at most
    ``limit`` characters (each then counts as a token of the budget)."""
    if all(b - a <= limit for a, b in offsets):
        return offsets
    out: list[tuple[int, int]] = []
    for a, b in offsets:
        if b - a <= limit:
            out.append((a, b))
        else:
            out.extend((s, min(s + limit, b)) for s in range(a, b, limit))
    return out


def _sections(doc: Document) -> list[tuple[int, int]]:
    """(start, end) character spans of the text between consecutive headings."""
    cuts = sorted({0, *(h.offset for h in doc.headings if 0 < h.offset < len(doc.text))})
    return [(s, e) for s, e in zip(cuts, [*cuts[1:], len(doc.text)]) if doc.text[s:e].strip()]


def _boundary_strength(text: str) -> bytearray:
    """How good a cut is before each character position (0 = not a boundary): one byte per
    position (a dict of every boundary took about 100 bytes per word)."""
    strength = bytearray(len(text) + 1)
    for level, pattern in _BOUNDARIES:
        for m in pattern.finditer(text):
            if strength[m.end()] < level:
                strength[m.end()] = level
    return strength


def _split_section(
    offsets: list[tuple[int, int]], strength: bytearray, budget: int, overlap: int
) -> list[tuple[int, int, int]]:
    """(start char, end char, token count) of the chunks of one section, given its tokens'
    absolute character ``offsets`` and the cut ``strength`` at each character position."""
    n = len(offsets)
    if n <= budget:
        return [(offsets[0][0], offsets[-1][1], n)]
    starts = [a for a, _ in offsets]
    # a chunk may start at token t with the strength of the boundary just before it
    tok_strength = [strength[starts[t]] if t else 4 for t in range(n)]
    spans, s = [], 0
    while s < n:
        if n - s <= budget:
            spans.append((starts[s], offsets[-1][1], n - s))
            break
        hi = s + budget  # exclusive end token: the chunk is tokens [s, e)
        lo = s + max(1, budget // 2)
        best = max(range(lo, hi + 1), key=lambda t: (tok_strength[t], t))
        e = best if tok_strength[best] > 0 else hi
        spans.append((starts[s], offsets[e - 1][1], e - s))
        nxt = max(s + 1, e - overlap)
        while nxt < e and tok_strength[nxt] == 0:  # start the overlap on a word boundary
            nxt += 1
        s = nxt
    return spans


def chunk_id(source: str, text_hash: str, start: int, end: int) -> str:
    """Stable id: same file content and chunking give the same ids on every run."""
    return hashlib.sha1(f"{source}\x00{text_hash}\x00{start}\x00{end}".encode()).hexdigest()[:20]


def _merge_small(ranges: list[tuple[int, int]], budget: int) -> list[tuple[int, int, int]]:
    """Join a tiny section (usually a heading with no body) onto the section after it.
    ``ranges`` are token index ranges; returns (first token, end token, anchor token) where the
    anchor is the first token of the section that gives the merged one its heading path.

    A run of tiny sections keeps joining while the next one is tiny too and the group stays
    within ``budget``: 200,000 bare ``# h`` headings were 12,500 chunks of 32 tokens (every
    chunk embedded, 38 s here), and are 1,563 chunks this way. A group of tiny sections followed
    by an ordinary one is cut as before, so ordinary documents chunk as they always did."""
    out: list[tuple[int, int, int]] = []
    carry: int | None = None
    small = max(1, budget // _MIN_SECTION_FRACTION)
    for i, (s, e) in enumerate(ranges):
        first = s if carry is None else carry
        if e - first < small:
            carry = first
            continue
        if e - s < small and i + 1 < len(ranges):  # tiny, completing a group of tiny ones
            ns, ne = ranges[i + 1]
            if ne - ns < small and ne - first <= budget:
                carry = first
                continue
        out.append((first, e, s))
        carry = None
    if carry is not None:
        if out:
            out[-1] = (out[-1][0], ranges[-1][1], out[-1][2])
        else:
            out.append((carry, ranges[-1][1], carry))
    return out


def chunk_document(
    doc: Document,
    tokenizer,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    overlap: int = DEFAULT_OVERLAP,
    max_tokens: int | None = None,
    deadline: Callable[[], None] | None = None,
    max_file_tokens: int | None = None,
) -> list[Chunk]:
    """Split ``doc`` into chunks of at most ``min(chunk_tokens, max_tokens)`` tokens of
    ``tokenizer`` (special tokens excluded) and at most that many times
    :data:`MAX_TOKEN_CHARS` characters. ``max_tokens`` defaults to the tokenizer's
    ``model_max_length`` minus its special tokens, i.e. what the encoder can read.
    ``deadline``: called every :data:`CHECK_EVERY` sections and chunks; it raises to stop
    (``rag.documents.Deadline.check``: the file's one time bound, loading included).
    ``max_file_tokens``: a text of more tokens (as the chunk budget counts them) raises
    :class:`~rag.documents.DocumentError` once tokenising has read past it
    (``--max-file-tokens``)."""
    check = deadline or (lambda: None)
    if max_tokens is None:
        limit = getattr(tokenizer, "model_max_length", None) or 512
        limit = limit if limit < 1_000_000 else 512
        max_tokens = limit - special_tokens(tokenizer)
    budget = min(chunk_tokens, max_tokens)
    if budget < 8:
        raise ValueError(f"chunk size {budget} tokens is too small (need at least 8)")
    if not 0 <= overlap < chunk_tokens // 2:
        raise ValueError(
            f"--overlap must be in [0, {chunk_tokens // 2}) for {chunk_tokens}-token chunks, got {overlap}"
        )
    if budget < chunk_tokens:  # the encoder reads less than asked: keep overlap proportionate
        overlap = min(overlap, budget // 4)
    backend = _backend(tokenizer)
    text = doc.text
    offsets = _split_long_tokens(_token_offsets(backend, text, max_file_tokens), MAX_TOKEN_CHARS)
    if max_file_tokens is not None and len(offsets) > max_file_tokens:
        raise DocumentError(
            doc.path, f"more than {max_file_tokens:,} tokens to embed (--max-file-tokens)"
        )
    check()
    starts = [a for a, _ in offsets]
    ranges = [(bisect_left(starts, s), bisect_left(starts, e)) for s, e in _sections(doc)]
    strength = _boundary_strength(text)
    check()
    spans: list[tuple[int, int, int]] = []  # (start, end, heading anchor) in characters
    merged = _merge_small([r for r in ranges if r[1] > r[0]], budget)
    for i, (first, end, anchor) in enumerate(merged):
        if i % CHECK_EVERY == 0:
            check()
        for a, b, n in _split_section(offsets[first:end], strength, budget, overlap):
            anchor_char = max(a, starts[anchor])
            # re-tokenising a substring can differ at its edges: re-check chunks near the limit
            pieces = _fit(text, a, b, backend, budget) if n > budget - 16 else [(a, b)]
            spans.extend((pa, pb, anchor_char) for pa, pb in pieces)
    text_hash = hashlib.sha256(text.encode()).hexdigest()
    chunks = []
    for i, (a, b, anchor) in enumerate(spans):
        if i % CHECK_EVERY == 0:
            check()
        if text[a:b].strip():
            chunks.append(
                Chunk(
                    id=chunk_id(doc.path, text_hash, a, b),
                    text=text[a:b],
                    source=doc.path,
                    heading_path=doc.heading_path_at(max(a, anchor) if anchor < b else a),
                    start=a,
                    end=b,
                    page=doc.page_at(a),
                )
            )
    return chunks


def _fit(text: str, a: int, b: int, backend, budget: int) -> list[tuple[int, int]]:
    """Spans covering ``text[a:b]``, each at most ``budget`` tokens when tokenised alone."""
    out = []
    while a < b:
        enc = backend.encode(text[a:b], add_special_tokens=False)
        if len(enc.ids) <= budget:
            out.append((a, b))
            break
        ends = [o[1] for o in enc.offsets if o[1] > o[0]]
        n = min(budget, len(ends))
        while (
            n > 1
            and len(backend.encode(text[a : a + ends[n - 1]], add_special_tokens=False).ids)
            > budget
        ):
            n -= 1
        end = a + ends[n - 1]
        out.append((a, end))
        a = end + len(text[end:b]) - len(text[end:b].lstrip())
    return out


def indexed_text(chunk: Chunk, context: bool = True) -> str:
    """What the encoder embeds for ``chunk``. With ``context``, its text under one line naming
    its file (the name without its type's suffix) and its heading path,
    ``git-push › git-push(1) › OPTIONS``: a contextual chunk header, as LlamaIndex embeds a
    node's file name and Haystack its ``meta_fields_to_embed``. A chunk from the middle of a
    manual page rarely names the command it documents ("-d, --delete: All listed refs are
    deleted from the remote repository"); its file and section do. BM25 indexes the text alone:
    with the header there, a question's common words that name files ("commit", "branch")
    pulled in every chunk of git-commit or git-branch (docs/retrieval.md). The stored, shown
    and cited text stays the chunk's own."""
    if not context:
        return chunk.text
    name = PurePath(chunk.source).name
    for _ in range(2):  # Sphinx's os.path.rst.txt is os.path
        suffix = next((s for s in SUPPORTED_SUFFIXES if name.lower().endswith(s)), None)
        if suffix is None or len(name) == len(suffix):
            break
        name = name[: -len(suffix)]
    header = " › ".join(part for part in (name, *chunk.heading_path) if part.strip())
    return f"{header}\n{chunk.text}" if header else chunk.text
