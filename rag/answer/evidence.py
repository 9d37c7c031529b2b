"""Evidence selection: the encoder reads the retrieved passages and keeps the sentences that answer.

Why: the decoder's time goes to its prompt (prefill is most of an answer on a 2-core CPU), and a
small decoder reads five whole passages worse than the few sentences that matter. The
bidirectional encoder that retrieved the passages reads them again at a finer grain, cheaply:
every passage is cut into units (a sentence, a list item, a code block, a table row), each unit
gets a vector from the index's own encoder and is scored against the question, and the best units
within a token budget are kept, in document order, as one excerpt per passage. The decoder then
writes from a prompt a fraction of the size (:func:`rag.answer.prompt.build_evidence_messages`).

For a factoid (the pipeline decides) a prose unit's vector is read in context where the encoder
allows (late chunking, :meth:`rag.retrieval.encoder.Encoder.encode_spans`): the whole passage
goes through the encoder once and the unit's token states are mean-pooled, so a sentence that
says "it" carries what its passage says it is; every other unit is embedded alone. A unit's
score is its cosine to the query plus a lexical term: the share
of the question's content words the unit holds (what a user typed, an option name or a command,
often occurs verbatim in the answer). A unit that ends with ``:`` introduces what follows (a
code block, a list), so the next unit comes with it. A unit that ends with a question mark
answers nothing itself (an FAQ heading; on the demo's own docs, a quotation of the very question
asked scored best): it scores as the unit after it and brings it, and with nothing after it in
its passage it is never kept. The passage ranked first by retrieval
always contributes its best unit, so an excerpt set is never without the top hit.

Measured in docs/answering.md against five whole passages.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from rag.answer.support import content_words

# (passages, each passage's unit spans) -> one vector (or None) per span: reading in context
ReadSpans = Callable[[list[str], list[list[tuple[int, int]]]], list[list[np.ndarray | None]]]
LEXICAL_WEIGHT = 0.3  # weight of the question-word share beside the cosine (chosen on dev sets)
# a factoid's: the share with each word weighted by its rarity among the units read
# (:func:`lexical_shares`; chosen on SQuAD train questions)
RARE_WORDS_WEIGHT = 0.8
# padded tokens per encoder batch: units differ in length (a 5-word sentence, a long code block),
# and a batch is padded to its longest unit, so small batches of similar lengths waste far less
# than the 8k-token batches that suit chunks of equal size (docs/answering.md measures it)
UNIT_BATCH_TOKENS = 1024
# padded tokens per batch when whole passages are read for their units' vectors (late
# chunking): ten chunks of similar length, one batch
EVIDENCE_BATCH_TOKENS = 4096
MAX_UNIT_WORDS = 60  # longer prose is cut into pieces of about this many words
KIND_WEIGHT = 0.1  # added to a unit holding what a number or date question asks for (dev sets)

# blocks are separated by blank lines, and by an AsciiDoc list continuation (a "+" alone on
# its line: what follows is another paragraph of the same list item or definition)
_BLANK = re.compile(r"\n(?:[ \t\r\f\v]*\+?[ \t\r\f\v]*\n)+")
# a sentence ends at . ! ? before one that starts with a capital or a digit (quoted, bracketed
# or bold), or with an inline literal (`make setup` creates …; ``len()`` returns …), which
# technical prose often starts with in lower case; not after e.g., i.e., cf. or vs., nor after
# the ".." of a reST directive (".. Note::")
_SENTENCE = re.compile(
    r"(?<=[.!?])(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bcf\.)(?<!\bvs\.)(?<!^\.\.)(?<!\s\.\.)\s+"
    r"(?=[\"'(`*]?[A-Z0-9]|`{1,2}[^`\s])"
)
_CODE_LINE = re.compile(r"^(?:\s{2,}|\t|>>>|\$ |\.\.\. )")
# an AsciiDoc listing or literal block's delimiter line ("-----", "....."): what lies between is code
_LISTING = re.compile(r"^\s*(?:-{4,}|\.{4,})\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)]|#\.)\s+")
# a Markdown code fence's line: three or more backticks or tildes, indented by at most three
# spaces, with a language ("```bash", "``` python {.numberLines}") or none
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([\w.+#-]*(?:[ \t]*\{[^}\n]*\})?)[ \t]*$", re.M)
_ASKS = re.compile(r"\?[\"'`*_)\].,;:]*$")  # a unit that ends in a question mark (quoted or not)
_TABLE_ROW = re.compile(r"^\|.*\|.*\|\s*$")  # a markdown (pipe) table's line: two cells or more
_GRID_BORDER = re.compile(r"^\s*\+[-=+:]+\+\s*$")  # a reST grid table's border line
_TABLE_RULE = re.compile(r"^\s*\|?(?:\s*:?-+:?\s*\|)+(?:\s*:?-+:?\s*)?\s*$")  # |---|:--:|
CUT = "…"  # marks text left out of an excerpt or a quote
# a passage that starts inside a sentence: prose that begins with a lower-case word, then
# another, and ends a sentence (a chunk's overlap starts at any word: "which will replace the
# old commit by a new commit …", "be cancelled, but …"); its first unit is quoted after "… "
# (:func:`excerpts_of`). Not an identifier that starts a sentence ("pg_dump is …",
# "list.remove(x): …", "lambda An …"), a term and its description ("bare repository: A …"),
# a title or a table's cell, which end no sentence.
_CONTINUES = re.compile(
    r"(?![\w\s'-]{1,40}:\s)[a-z][a-z']*[,;)]?\s+[a-z`\"'(*].*[.!?:][\"'`)*\]]*$", re.S
)
# an AsciiDoc definition list's term, alone on its line ("--cached [<commit>]::", "patch::",
# "GIT_DIR::"), not a reST paragraph that introduces a literal block ("Example::", "The
# Makefiles have five parts::"), whose indented block is a listing, not a description
_TERM = re.compile(r"(?![A-Z][a-z])\S.*::")


@dataclass(frozen=True)
class Unit:
    """A piece of a passage: its character offsets in the passage text."""

    passage: int  # index of the passage among those given
    start: int
    end: int
    # prose (a sentence, or a piece of a long one) is read in its passage where the encoder can
    # (late chunking); a table row, a list item or a code block stands alone and is embedded so
    prose: bool = True


@dataclass(frozen=True)
class Excerpt:
    """The units kept from one passage, joined in document order (gaps marked with ``…``)."""

    passage: int  # index of the passage among those given
    text: str
    units: tuple[Unit, ...]
    # every kept unit as (score, its text with the unit it introduces (``:``) or asks for
    # (``?``)), best first: what is quoted under a written answer (:func:`quotations`); the
    # passage's first unit after "… " when the passage starts inside a sentence (_CONTINUES)
    ranked: tuple[tuple[float, str], ...]

    @property
    def score(self) -> float:
        """The best kept unit's score."""
        return self.ranked[0][0]

    @property
    def best(self) -> str:
        """The best kept unit's text (with what it brings): the answer when the decoder
        writes nothing."""
        return self.ranked[0][1]


def _pieces(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Prose ``text[start:end]`` cut into sentences, long ones into ~MAX_UNIT_WORDS pieces."""
    out = []
    pos = start
    for m in [*_SENTENCE.finditer(text, start, end), None]:
        stop = m.start() if m else end
        seg = text[pos:stop]
        if seg.strip():
            words = list(re.finditer(r"\S+", seg))
            for i in range(0, len(words), MAX_UNIT_WORDS):
                group = words[i : i + MAX_UNIT_WORDS]
                out.append((pos + group[0].start(), pos + group[-1].end()))
        pos = m.end() if m else end
    return out


def _line_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The non-blank lines of ``text[start:end]`` as (start, end) offsets, whitespace trimmed."""
    out, off = [], start
    for ln in text[start:end].splitlines(keepends=True):
        if ln.strip():
            out.append((off + len(ln) - len(ln.lstrip()), off + len(ln.rstrip())))
        off += len(ln)
    return out


def _table_units(text: str, start: int, end: int, passage: int) -> list[Unit] | None:
    """A block holding a markdown pipe table (two or more lines that start and end with ``|``
    and hold two cells or more, unindented unless the block has a ``|---|`` rule, in a block
    with no ``+---+`` border of a grid table): each row one unit (a ``|---|`` rule none), the
    lines around it as prose; None without one. A chunk may start or end inside a table,
    without its header or rule, so neither is required.

    Why: a row is one fact (a setting, its default, what it does); as prose the rows run
    together into one "sentence" cut every MAX_UNIT_WORDS words, so a row's answer came with
    the ends of its neighbours, and scored with their words."""
    lines = _line_spans(text, start, end)
    # a row starts its line: an indented one is in a literal block (a diagram, a listing),
    # unless the block has a |---| rule: then it is a table inside a list item or a note
    ruled = any(_TABLE_RULE.match(text[a:b]) for a, b in lines)  # a rule holds a "|"
    rows = [
        bool(_TABLE_ROW.match(text[a:b])) and (ruled or a == 0 or text[a - 1] == "\n")
        for a, b in lines
    ]
    if any(_GRID_BORDER.match(text[a:b]) for a, b in lines):
        return None
    first = next((j for j in range(len(lines) - 1) if rows[j] and rows[j + 1]), None)
    if first is None:
        return None
    last = first + 1
    while last + 1 < len(lines) and rows[last + 1]:
        last += 1
    units = []
    if first > 0:
        units += [Unit(passage, s, e) for s, e in _pieces(text, lines[0][0], lines[first - 1][1])]
    units += [
        Unit(passage, s, e, prose=False)
        for s, e in lines[first : last + 1]
        if not _TABLE_RULE.match(text[s:e])
    ]
    if last + 1 < len(lines):  # after the table: prose, or another table
        rest = _table_units(text, lines[last + 1][0], end, passage)
        units += (
            rest
            if rest is not None
            else [Unit(passage, s, e) for s, e in _pieces(text, lines[last + 1][0], lines[-1][1])]
        )
    return units


def _is_term(block: str) -> bool:
    """Whether ``block`` names what the block after it describes: AsciiDoc definition terms
    (each line ends in ``::``: "-p::", "--patch::"), or a reST directive that renders prose
    (".. function:: addressof(obj)", ".. note::"), whose description is the indented block
    after it."""
    lines = block.strip().splitlines()
    if m := _DIRECTIVE.match(lines[0]):
        return m.group(1).lower() not in _NO_PROSE
    return len(lines) <= 4 and all(_TERM.fullmatch(ln.strip()) for ln in lines)


def split_units(text: str, passage: int = 0) -> list[Unit]:
    """A passage's units: blocks are split at blank lines (a Markdown fenced code block is one
    block, blank lines and all: :func:`_blocks`); a block whose lines look like code
    (indented, ``>>>``, ``$``, or between AsciiDoc listing delimiters ``----``) stays whole, as
    does each list item's line and each row of a markdown table; prose is split into
    sentences. A definition's term (AsciiDoc's "--cached::", a reST directive's signature) is
    one unit with the first unit of the description after it, which rarely names what it
    describes ("This form is to view the changes you staged …"; manuals indent a
    description, so it is often a code-like block, kept whole). Offsets index ``text``."""
    units: list[Unit] = []
    term: tuple[int, int, bool] | None = None  # a term block's first unit, its start, directive?
    for pos, stop, fenced in _blocks(text):
        block = text[pos:stop]
        if fenced:  # a Markdown code fence, blank lines and all: one code unit
            units.append(Unit(passage, pos, stop, prose=False))
            term = None
        elif block.strip():
            lines = [ln for ln in block.splitlines() if ln.strip()]
            lead = pos + (len(block) - len(block.lstrip()))
            tail = pos + len(block.rstrip())
            first = len(units)
            table = _table_units(text, lead, tail, passage) if len(lines) > 1 else None
            if table is not None:
                units.extend(table)
            elif (
                all(_CODE_LINE.match(ln) for ln in lines)
                or (
                    len(lines) > 1
                    and sum(bool(_CODE_LINE.match(ln)) for ln in lines) > len(lines) / 2
                )
                or (len(lines) > 2 and _LISTING.match(lines[0]) and _LISTING.match(lines[-1]))
            ):
                units.append(Unit(passage, lead, tail, prose=False))
            elif all(_LIST_ITEM.match(ln) for ln in lines) and len(lines) > 1:
                off = pos
                for ln in block.splitlines(keepends=True):
                    if ln.strip():
                        s = off + (len(ln) - len(ln.lstrip()))
                        units.append(Unit(passage, s, off + len(ln.rstrip()), prose=False))
                    off += len(ln)
            else:
                units.extend(Unit(passage, s, e) for s, e in _pieces(text, lead, tail))
            # a definition: its term joins the first unit of the block after it (a directive's
            # only when indented under it, as its content is)
            if (
                term is not None
                and term[0] == first - 1  # the term block is one unit
                and len(units) > first
                and (not term[2] or lines[0][:1].isspace())
            ):
                units[term[0] : first + 1] = [
                    Unit(passage, term[1], units[first].end, units[first].prose)
                ]
            term = (first, lead, block.lstrip().startswith("..")) if _is_term(block) else None
    return units


def _fences(text: str) -> list[tuple[int, int]]:
    """The Markdown fenced code blocks of ``text`` as (start, end) offsets, fence lines
    included. A block closes at the next fence of its character, as long, with no language,
    or runs to the end of the text (the chunk's end cut it). A chunk may also start inside a
    block: with an odd number of backtick fences whose first is bare ("```", no "```bash"),
    that one closes a block from the start. A bare line of tildes, or of more than four
    backticks, under a line of text, or of more than four tildes, opens nothing: it is a reST
    heading's rule ("RCU" over "~~~", an overline), unless it closes a block."""
    marks = []  # (start, end, fence, language, a heading's rule?)
    for m in _FENCE.finditer(text):
        fence, info = m.group(1), m.group(2).strip()
        above = text[text.rfind("\n", 0, max(m.start() - 1, 0)) + 1 : max(m.start() - 1, 0)]
        long = len(fence) > 4
        rule = not info and (fence[0] == "~" or long) and (bool(above.strip()) or long)
        marks.append((m.start(), m.end(), fence, info, rule))
    spans: list[tuple[int, int]] = []
    ticks = [i for i, mark in enumerate(marks) if mark[2][0] == "`" and not mark[4]]
    if len(ticks) % 2 and not marks[ticks[0]][3]:  # the chunk starts inside a block
        spans.append((0, marks[ticks[0]][1]))
        marks = marks[ticks[0] + 1 :]
    opened = None
    for start, end, fence, info, rule in marks:
        if opened is None:
            opened = None if rule else (start, fence)
        elif fence[0] == opened[1][0] and len(fence) >= len(opened[1]) and not info:
            spans.append((opened[0], end))
            opened = None
    if opened is not None:
        spans.append((opened[0], len(text.rstrip())))
    return spans


def flatten(text: str) -> str:
    """``text`` with its whitespace collapsed to single spaces, except inside Markdown fenced
    code blocks (:func:`_fences`), which keep their lines (on lines of their own, blank lines
    and common indentation left out).

    Why: the decoder reads excerpts and passages this way (:func:`rag.answer.prompt.
    format_passages`), and it copies code as it reads it: a fence collapsed onto one line
    ("```bash python -m rag.docs list --index manuals python -m rag.docs remove …```") came
    back in answers as one run-on command line."""
    spans = _fences(text)
    if not spans:
        return " ".join(text.split())
    out, pos = [], 0
    for start, end in spans:
        out.append(" ".join(text[pos:start].split()))
        code = textwrap.dedent(text[start:end].strip("\n"))
        out.append("\n".join(ln.rstrip() for ln in code.splitlines() if ln.strip()))
        pos = end
    out.append(" ".join(text[pos:].split()))
    return "\n".join(part for part in out if part)


def _blocks(text: str) -> list[tuple[int, int, bool]]:
    """``text`` as (start, end, fenced) blocks: a fenced code block whole (:func:`_fences`), the
    text between fences split at blank lines (:data:`_BLANK`); blank blocks left out.

    Why: a fence's code often holds blank lines (between a function's imports and its body),
    and cut at them, its pieces were read as prose sentences, split again at a "?" in a string."""
    out: list[tuple[int, int, bool]] = []
    pos = 0
    for start, end in [*_fences(text), (len(text), len(text))]:
        for m in [*_BLANK.finditer(text, pos, start), None]:
            stop = m.start() if m else start
            if text[pos:stop].strip():
                out.append((pos, stop, False))
            pos = m.end() if m else start
        if end > start:
            out.append((start, end, True))
        pos = end
    return out


# the answer's kind, where the question says it: a number ("How many ...", "What year ...") or a
# date ("When did ...", "In what century ..."), and what a unit holding one has
_ASKS_NUMBER = re.compile(
    r"\bhow\s+(?:many|much|long|old|far|large|big|tall|high|often|fast|wide|deep|heavy)\b"
    r"|\bwhat\s+(?:percentage|percent|proportion|fraction|number|amount)\b|\b(?:what|which)\s+year\b",
    re.I,
)
_ASKS_DATE = re.compile(
    r"^\W*when\b|\bwhen\s+(?:did|was|were|is|does|do|will|had)\b"
    r"|\bwhat\s+(?:date|day|month|century|decade|time|era)\b",
    re.I,
)
_NUMBER = re.compile(
    r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty"
    r"|forty|fifty|hundred|thousand|million|billion|dozen|half|several|few)\b",
    re.I,
)
_DATE = re.compile(
    r"\b\d{3,4}s?\b|\b(?:January|February|March|April|May|June|July|August|September|October"
    r"|November|December|century|decade|spring|summer|autumn|fall|winter|Monday|Tuesday"
    r"|Wednesday|Thursday|Friday|Saturday|Sunday)\b"
)


def answer_kind(question: str) -> re.Pattern[str] | None:
    """What a unit that can answer ``question`` holds, where the question says the answer's
    kind: a number for "How many / how long / what year ...", a year, month or day for "When
    ..."; None for any other question. Expected answer types are an old device of extractive
    QA; here they only break near-ties in the encoder's ranking (:data:`KIND_WEIGHT`)."""
    if _ASKS_NUMBER.search(question):
        return _NUMBER
    if _ASKS_DATE.search(question):
        return _DATE
    return None


def topic_words(question: str) -> set[str]:
    """The question's content words less those that ask for the answer's kind ("many" of "How
    many", "year" of "What year": :func:`answer_kind`'s phrases). The sentence that answers
    says "ten" or "1850", not "many"; weighted by rarity, such a word had raised the sentences
    that happen to hold it (over this project's docs, quoted "How many …" questions above the
    settings row that answers)."""
    return content_words(_ASKS_DATE.sub(" ", _ASKS_NUMBER.sub(" ", question)))


def lexical_shares(
    question_words: set[str], texts: Sequence[str], rarity: bool = False
) -> np.ndarray:
    """Per text, the share of the question's content words it holds; with ``rarity``, each
    word weighted by its inverse document frequency among ``texts`` (BM25's idf, the units
    read as the documents). The passages retrieved for a question all share its topic:
    "Huguenots" is in most units read for "Under which leader did the Huguenots fight?",
    "leader" in few, and the sentence that answers is the one holding the rare word. It ranks
    a factoid's answering sentence higher; a how-question's quotes and excerpts it made worse
    (docs/answering.md)."""
    if not question_words or not texts:
        return np.zeros(len(texts))
    held = [question_words & content_words(t) for t in texts]
    if not rarity:
        return np.array([len(h) / len(question_words) for h in held])
    n = len(texts)
    idf = {w: np.log((n + 1) / (sum(w in h for h in held) + 0.5)) for w in question_words}
    total = sum(idf.values())
    return np.array([sum(idf[w] for w in h) / total for h in held])


@dataclass(frozen=True)
class Scored:
    """Every unit of the given passages with its score (:func:`score_units`)."""

    units: list[Unit]
    texts: list[str]  # each unit's text, whitespace collapsed (a code fence's lines kept: flatten)
    scores: np.ndarray  # -inf: a question with no answer after it in its passage
    asks: list[bool]  # the unit ends in a question mark
    # the same with the plain question-word share where ``scores`` weigh words by rarity: what
    # the answerability check weighs (:func:`best_unit`). Rarity is counted among the units
    # read, so it ranks them against each other but says less of whether any one answers.
    plain: np.ndarray | None = None


def score_units(
    question: str,
    passages: Sequence[str],
    embed: Callable[[list[str], str], np.ndarray],
    lexical_weight: float = LEXICAL_WEIGHT,
    read: ReadSpans | None = None,
    rarity: bool = False,
) -> Scored:
    """Every unit of ``passages`` scored against ``question``: cosine plus ``lexical_weight`` x
    the share of the question's content words it holds (with ``rarity``, each weighted by its
    rarity among the units, :func:`lexical_shares`, and the words asking for the answer's kind
    left out, :func:`topic_words`), plus :data:`KIND_WEIGHT` when the
    question asks for a number or a date and the unit holds one (:func:`answer_kind`); a unit
    ending in ``?`` takes the score of the unit after it in its passage (-inf without one).
    ``embed(texts, kind)`` returns L2-normalised rows (``kind`` "query" or "document":
    :meth:`rag.retrieval.encoder.Encoder.encode`). With ``read(passages, spans)``
    (:meth:`rag.retrieval.encoder.Encoder.encode_spans`), a unit's vector is read inside its
    passage (late chunking) rather than embedded alone; a unit it returns None for (past the
    encoder's length) is embedded alone."""
    units = [u for i, p in enumerate(passages) for u in split_units(p, i)]
    if not units:
        return Scored([], [], np.zeros(0), [])
    texts = [flatten(passages[u.passage][u.start : u.end]) for u in units]
    q = embed([question], "query")[0]
    vecs = unit_vectors(passages, units, texts, embed, read)
    qwords = content_words(question)
    base = vecs @ q
    if (kind := answer_kind(question)) is not None:
        base += KIND_WEIGHT * np.array([kind.search(t) is not None for t in texts])
    words = topic_words(question) if rarity else qwords
    scores = base + lexical_weight * lexical_shares(words, texts, rarity)
    plain = base + LEXICAL_WEIGHT * lexical_shares(qwords, texts) if rarity else None
    asks = [bool(_ASKS.search(t)) for t in texts]
    for i in range(len(units) - 1, -1, -1):  # from the end: a run of questions takes its answer's
        if asks[i]:
            same = i + 1 < len(units) and units[i + 1].passage == units[i].passage
            for row in (scores, plain) if plain is not None else (scores,):
                row[i] = row[i + 1] if same else -np.inf
    return Scored(units, texts, scores, asks, plain)


def unit_vectors(
    passages: Sequence[str],
    units: list[Unit],
    texts: list[str],
    embed: Callable[[list[str], str], np.ndarray],
    read: ReadSpans | None,
) -> np.ndarray:
    """One L2-normalised row per unit: a prose unit read in its passage by ``read`` where it
    can, every other unit embedded alone (:func:`score_units`). A table row read among its
    neighbours took their words: on this project's docs the settings row that answers "How many
    passages does the encoder read?" lost to a sentence of another page."""
    if read is None:
        return embed(texts, "document")
    spans: list[list[tuple[int, int]]] = [[] for _ in passages]
    for u in units:
        if u.prose:
            spans[u.passage].append((u.start, u.end))
    got = read(list(passages), spans)
    seen = [0] * len(passages)
    rows: list[np.ndarray | None] = []
    for u in units:
        if not u.prose:
            rows.append(None)
            continue
        rows.append(got[u.passage][seen[u.passage]])
        seen[u.passage] += 1
    alone = [i for i, r in enumerate(rows) if r is None]
    if alone:
        for i, v in zip(alone, embed([texts[i] for i in alone], "document")):
            rows[i] = v
    return np.stack([np.asarray(r, dtype=np.float32) for r in rows])


def read_units(encoder: Any, question: str, passages: Sequence[str]) -> Scored:
    """:func:`score_units` with ``encoder`` (a :class:`rag.retrieval.encoder.Encoder`, or
    anything with ``encode(texts, kind)``), as the answer path reads: units embedded in small
    batches of similar length (:data:`UNIT_BATCH_TOKENS`: they pad less). For a factoid, the
    units are read inside their passages where the encoder can (late chunking) and the
    question's words weighted by their rarity among them (:data:`RARE_WORDS_WEIGHT`): on SQuAD
    train questions the two best units held the answer more often with each; on the
    how-questions of the Git and Linux dev sets either cited the right page less or quoted
    fewer of the expected terms (docs/answering.md)."""
    from rag.retrieval.encoder import Encoder

    def embed(texts: list[str], kind: str) -> Any:
        if isinstance(encoder, Encoder):
            return encoder.encode(texts, kind, batch_tokens=UNIT_BATCH_TOKENS)
        return encoder.encode(texts, kind)

    if asks_how(question):
        return score_units(question, passages, embed)
    read = None
    if isinstance(encoder, Encoder) and encoder.reads_in_context:
        read = partial(encoder.encode_spans, batch_tokens=EVIDENCE_BATCH_TOKENS)
    return score_units(question, passages, embed, RARE_WORDS_WEIGHT, read, rarity=True)


def best_unit(scored: Scored, passages: int) -> float | None:
    """The best unit score among the first ``passages`` passages (the answerability check's
    sentence signal, rag.answer.answerability: with the plain question-word share it was
    fitted on, :attr:`Scored.plain`), or None when they hold no unit to read."""
    scores = scored.scores if scored.plain is None else scored.plain
    best = [s for u, s in zip(scored.units, scores) if u.passage < passages]
    best = [s for s in best if s > -np.inf]
    return float(max(best)) if best else None


# a sentence's end: a full stop, "!", "?", an ellipsis, or ":" and ";", a closing quote or bracket
_ENDED = re.compile(r"[.!?…:;][\"'`*_)\]]*$")


def _brings_next(scored: Scored, i: int) -> bool:
    """Whether unit ``i`` comes with the unit after it in its passage: it ends in ``:`` (it
    introduces an example, a list), asks a question (the next unit answers it), or is prose
    that stops mid-sentence before a code block or list ("… you can always return to the
    pre-merge state with" above "$ git merge --abort"): the block ends its sentence."""
    nxt = i + 1
    if nxt >= len(scored.units) or scored.units[nxt].passage != scored.units[i].passage:
        return False
    text = scored.texts[i]
    if text.endswith(":") or scored.asks[i]:
        return True
    unit = scored.units[i]
    return unit.prose and not scored.units[nxt].prose and not _ENDED.search(text)


LEAD_UNITS = 2  # the best units a factoid's short answer is read from (chosen on dev questions)


def lead_units(scored: Scored, n: int = LEAD_UNITS) -> list[tuple[int, str]]:
    """The ``n`` best units over all passages, best first, as (passage index, text): what the
    decoder reads to write a factoid's short answer (rag.answer.compose). A unit ending in
    ``?`` is left out (the unit after it, its answer, has its score), as is a repeat of one
    already taken (a page ingested twice); one ending in ``:`` brings the unit it introduces."""
    out: list[tuple[int, str]] = []
    for i in sorted(range(len(scored.units)), key=lambda j: -scored.scores[j]):
        if len(out) == n or scored.scores[i] == -np.inf:
            break
        if scored.asks[i]:
            continue
        text = scored.texts[i]
        if _brings_next(scored, i):
            text += " " + scored.texts[i + 1]
        if all(text != t for _, t in out):  # the same sentence in two passages: read it once
            out.append((scored.units[i].passage, text))
    return out


def select(
    question: str,
    passages: Sequence[str],
    embed: Callable[[list[str], str], np.ndarray],
    budget: int,
    count_tokens: Callable[[str], int],
    lexical_weight: float = LEXICAL_WEIGHT,
) -> list[Excerpt]:
    """The excerpts to give the decoder: the best-scoring units of ``passages`` (in retrieval
    order) whose tokens fit ``budget``, grouped per passage in document order; passages ordered
    by their best unit (:func:`score_units`, then :func:`excerpts_of`)."""
    return excerpts_of(score_units(question, passages, embed, lexical_weight), budget, count_tokens)


def excerpts_of(scored: Scored, budget: int, count_tokens: Callable[[str], int]) -> list[Excerpt]:
    """The excerpts :func:`select` describes, from units already scored."""
    units, texts, scores = scored.units, scored.texts, scored.scores
    if not units:
        return []
    order = sorted(range(len(units)), key=lambda i: -scores[i])
    # the first passage's best unit first: retrieval's best guess is never dropped
    first = next((i for i in order if units[i].passage == 0 and scores[i] > -np.inf), None)
    if first is not None:
        order.remove(first)
        order.insert(0, first)
    kept: set[int] = set()
    used = 0
    for i in order:
        if scores[i] == -np.inf:  # a question with no answer after it: nothing to read
            break
        group = [i]
        if _brings_next(scored, i):  # "Use it like this:" its example, "How do I ...?" its answer
            group.append(i + 1)
        cost = sum(count_tokens(texts[j]) + 2 for j in group if j not in kept)
        if used + cost > budget:
            if kept:
                continue
            group = [i]  # the best unit alone, whatever its size: cut to the budget below
        kept.update(group)
        used += cost
        if used >= budget:
            break
    first_unit: dict[int, int] = {}  # each passage's first unit
    for i, u in enumerate(units):
        first_unit.setdefault(u.passage, i)
    out = []
    for p in sorted({units[i].passage for i in kept}):
        idx = sorted(i for i in kept if units[i].passage == p)
        parts = [CUT] if idx[0] != first_unit[p] else []  # the passage's start was left out
        for a, b in zip([None, *idx], idx):
            if a is not None and b != a + 1:
                parts.append(CUT)
            parts.append(texts[b])
        # a code fence's lines (flatten) start and end a line of their own
        text = "".join(
            ("\n" if "\n" in a + b else " ") + b if a else b for a, b in zip(["", *parts], parts)
        )
        ranked: list[tuple[float, str]] = []
        for j in sorted(idx, key=lambda j: -scores[j]):
            unit = texts[j]
            if _brings_next(scored, j) and j + 1 in idx:
                unit += " " + texts[j + 1]  # what it introduces or the answer it asks for
            if j == first_unit[p] and units[j].prose and _CONTINUES.match(texts[j]):
                unit = f"{CUT} {unit}"  # shown as the end of a sentence, not a whole one
            if not any(unit in t for _, t in ranked):  # an example its ":" unit brought
                ranked.append((float(scores[j]), unit))
        kept_units = tuple(units[j] for j in idx)
        clipped = _clip(text, budget, count_tokens)
        out.append(Excerpt(p, clipped, kept_units, tuple(ranked)))
    out.sort(key=lambda e: (e.passage != 0, -e.score))
    return out


QUOTES_PER_EXCERPT = 2  # quotes drawn from one excerpt at most (chosen on the dev questions)


# what a quote names that an answer must name too to say it: an option, an inline literal
_QUOTED_TERMS = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*|`[^`\n]+`")


def quotations(
    excerpts: Sequence[Excerpt], answer: str, n: int, per_excerpt: int = QUOTES_PER_EXCERPT
) -> list[tuple[int, str]]:
    """Up to ``n`` of the encoder's best units to quote under the written answer, as (excerpt
    number from 1, the unit's text), best first over all excerpts' kept units
    (``Excerpt.ranked``), at most ``per_excerpt`` from one excerpt; a unit the answer already
    says (half or more of its content words are in it, and every option or inline literal it
    names: an answer that copies a definition but names another command does not say
    "--cached: This form is to view the changes you staged …") or with fewer than
    :data:`MIN_QUOTE_WORDS` content words (a heading) is skipped, and the excerpt's next unit
    may take its place. A floor on the score below the best excerpt's was tried and not kept
    (docs/answering.md).

    Why: the small decoder writes an answer that holds the manual's key terms (the command, the
    option) for a fraction of the questions whose excerpts hold them (docs/answering.md); the
    encoder's own best sentences, quoted word for word with their citation, carry them to the
    reader exactly, at no decoding cost. Quoting each excerpt's best unit only lost the
    sentence after a skipped one ("It means simply that HEAD refers to a specific commit" after
    "This is known as being in detached HEAD state", which the answer had said)."""
    if n <= 0 or not excerpts:
        return []
    said = content_words(answer)
    lowered = answer.lower()
    candidates = sorted(
        ((score, i, text) for i, e in enumerate(excerpts) for score, text in e.ranked),
        key=lambda c: -c[0],
    )
    out: list[tuple[int, str]] = []
    seen: list[str] = []  # the quotes taken, lower-cased, whole
    taken = [0] * len(excerpts)
    for _, i, unit in candidates:
        text = quotable(unit)
        words = content_words(text or "")
        if not text or len(words) < MIN_QUOTE_WORDS:
            continue
        terms = (t.strip("`").lower() for t in _QUOTED_TERMS.findall(text))
        if len(words & said) * 2 >= len(words) and all(t in lowered for t in terms):
            continue  # the answer says it, and names every option and literal it names
        low = text.removeprefix(f"{CUT} ").lower()  # a sentence's end is in the whole one
        if any(low in t for t in seen) or taken[i] == per_excerpt:
            continue  # already quoted whole (overlapping chunks, a page ingested twice)
        longer = next((j for j, t in enumerate(seen) if t in low), None)
        if longer is not None:  # a quote taken is part of this one ("… flag:" and its example)
            taken[out[longer][0] - 1] -= 1
            taken[i] += 1
            seen[longer] = low
            out[longer] = (i + 1, _cut_words(text, MAX_QUOTE_WORDS))
            continue
        seen.append(low)
        taken[i] += 1
        out.append((i + 1, _cut_words(text, MAX_QUOTE_WORDS)))
        if len(out) == n:
            break
    return out


_RULE = re.compile(r"\s*[=\-~^]{3,}\s*")  # a heading's underline, a listing's delimiter line
# inline markup a reader sees as noise in a quote, and what it shows: AsciiDoc anchors
# ([[def_HEAD]]), cross references (<<def_branch,branch>>, <<merge>>) and man-page links
# (linkgit:git-reset[1]); reST roles (:c:func:`kmalloc()`, :ref:`text <label>`) and literals
_MARKUP = (
    (re.compile(r"\[\[[\w.:-]+\]\]"), ""),
    (re.compile(r"<<[\w.:-]+,\s*([^<>]+?)>>"), r"\1"),
    (re.compile(r"<<([\w.:-]+)>>"), r"\1"),
    (re.compile(r"\blinkgit:([\w.-]+)\[(\d)\]"), r"\1(\2)"),
    (
        re.compile(r"(?<![\w:`]):((?:[\w-]+:)+)`([^`<]+?)\s*(?:<[^`>]*>)?`"),
        lambda m: _role(*m.groups()),
    ),
    (re.compile(r"(?<!`)``([^`]+)``(?!`)"), r"`\1`"),  # not a Markdown ``` fence
    # a literal block's marker ("To free pagecache:: echo 1 > …", reST) or a definition list's
    # term ("--cached:: Use this option …", AsciiDoc) is shown as a colon
    (re.compile(r"(?<=\S)::(?=\s|$)"), ":"),
    # a listing's or a heading's delimiter line, on its own between words once the lines are
    # joined ("… with ----- $ git merge --abort -----"): a rendered page shows a box, no dashes
    (re.compile(r"\s*(?<!\S)(?:-{4,}|\.{4,}|={4,}|~{4,})(?!\S)"), ""),
)

# a reST directive at the start of a quote, as Sphinx shows it: one that renders no prose (an
# index entry, an image, a kernel-doc include, a code block's head) is no quote at all; a version
# note is shown as its sentence; an admonition as its title; any other (a function's, a class's
# signature) as its argument
_DIRECTIVE = re.compile(r"\.\.\s+((?:[\w-]+:)?[\w-]+) ?::\s*")
_NO_PROSE = {
    *("index", "toctree", "include", "literalinclude", "only", "contents", "raw", "highlight"),
    *("figure", "image", "code-block", "code", "sourcecode", "tabularcolumns", "c:namespace"),
    *("doctest", "testcode", "testsetup", "testoutput", "currentmodule"),
    *("moduleauthor", "sectionauthor"),
    *("kernel-doc", "kernel-figure", "kernel-include", "kernel-abi", "kernel-feat"),
}
_VERSION_NOTE = {
    "versionadded": "Added in version {}:",
    "versionchanged": "Changed in version {}:",
    "deprecated": "Deprecated since version {}:",
}
_ADMONITION = {
    *("note", "warning", "tip", "important", "caution", "hint", "attention", "danger", "error"),
    "seealso",
}


def _directive(text: str) -> str | None:
    """``text`` with the reST directive it starts with shown as rendered (:data:`_DIRECTIVE`),
    None for one that renders no prose."""
    m = _DIRECTIVE.match(text)
    if m is None:
        return text
    name, rest = m.group(1).lower(), text[m.end() :]
    if name in _NO_PROSE:
        return None
    if name in _VERSION_NOTE:
        version, _, after = rest.partition(" ")
        return f"{_VERSION_NOTE[name].format(version)} {after}".strip()
    if name in _ADMONITION:
        return f"{'See also' if name == 'seealso' else name.capitalize()}: {rest}".strip()
    return re.sub(r"\s+:[\w-]+:(?=\s|$)", ":", rest) or None  # its fields (":synopsis: …")


def _role(role: str, target: str) -> str:
    """A reST role as Sphinx shows it: ``:pep:`343``` "PEP 343", ``:keyword:`!yield``` "`yield`",
    ``:c:member:`~PyConfig.argv``` "`argv`" (``!`` is no link, ``~`` the last name alone)."""
    if role in ("pep:", "rfc:"):
        return f"{role[:-1].upper()} {target}"
    if target.startswith("~"):
        target = target.rsplit(".", 1)[-1]
    return f"`{target.lstrip('!~')}`"


def plain_markup(text: str) -> str:
    """``text`` with the inline markup of :data:`_MARKUP` shown as a reader sees it rendered
    ("<<def_branch,branch>>" → "branch", "linkgit:git-reset[1]" → "git-reset(1)",
    ":c:func:`kmalloc()`" → "`kmalloc()`"); only for display: the passages keep their text."""
    for pattern, shown in _MARKUP:
        text = pattern.sub(shown, text)
    return text


# a Markdown heading alone ("## Install and first run"): capitalised, one line, indented by at
# most three spaces; a lower-case line or one with a path, a redirection, a variable or code in
# it ("# echo never > /sys/...", "# modprobe bonding") is a root prompt in a listing, and a
# comment that begins a code block has the code after it
_ATX_HEADING = re.compile(r" {0,3}#{1,6}[ \t]+[A-Z0-9][^\n/<>|=$`]*")


# a section heading a unit starts with, underlined (man pages' "DESCRIPTION" over "-----------"),
# then the section's text; an underline at least as long as its heading (give or take two, as
# AsciiDoc allows) and four or more long, so a reST title's " --- " dash is no underline
_SETEXT_LEAD = re.compile(r"\s*(?P<head>\S[^\n]{0,79}?)\s+(?P<rule>=+|-+|~+|\^+)\s+(?=\S)")


# a Markdown fenced code block in a unit's text as read, on one line: "```bash make setup ```"
# (tildes: three or four; a longer run is a reST heading's rule, which quotable drops)
_FENCED = re.compile(r"(?<!~)(`{3,}|~{3,4})[\w.+#-]*(?:\{[^}]*\})?\s+(.*?)\s*\1(?![`~])")
_LONE_FENCE = re.compile(r"\s*`{3,}[\w.+#-]*\s*")


def _inline_fences(text: str) -> str:
    """``text`` (a unit as read: one line) with each fenced code block shown as inline code,
    its fence markers left out ("```bash make setup ```" → "`make setup`"; code holding a
    backtick itself is left unwrapped), and the marker of a block the chunk cut dropped: in a
    one-line quote they read as stray backticks."""

    def inline(m: re.Match[str]) -> str:
        code = m.group(2)
        return code if "`" in code else f"`{code}`"  # one with backticks in it: as it is

    return _LONE_FENCE.sub(" ", _FENCED.sub(inline, text)).strip()


def quotable(unit: str) -> str | None:
    """``unit`` as a quote: a section heading it starts with left out (its label names the
    section, :func:`rag.answer.prompt.quote_source`), heading underlines and listing delimiters
    (``=====``, ``-----``, reST and AsciiDoc) taken out, as they mean nothing on one line, a
    reST directive it starts with and inline markup shown as rendered (:func:`_directive`,
    :func:`plain_markup`); None for a heading alone (one such rule at its end, and no full
    stop, command prompt or closing colon in it; or a Markdown heading line) or a directive
    that renders no prose (an index entry, an image, a kernel-doc include)."""
    if _ATX_HEADING.fullmatch(unit.strip("\n")):
        return None
    lead = _SETEXT_LEAD.match(unit)
    if lead and len(lead["rule"]) >= max(4, len(lead["head"]) - 2):
        unit = unit[lead.end() :]  # the section's name: the quote's label gives it
    rules = _RULE.findall(unit)
    text = _directive(" ".join(_RULE.sub(" ", _inline_fences(" ".join(unit.split()))).split()))
    if not text:
        return None
    text = plain_markup(text)
    heading = len(rules) == 1 and re.search(r"[=\-~^]{3,}\s*$", unit) is not None
    if heading and not re.search(r"[.;$]|:$", text):
        return None
    return text or None


# a question that asks how to do something, why, what something does or means, or about the
# asker's own situation: its answer is an explanation in the manual's own terms, not one fact (a
# factoid keeps its short answer alone). Matched at the start of any of the question's sentences
# ("I started a merge ... How do I cancel it?"), or anywhere for the first person.
_ASKS_HOW = re.compile(
    r"(?:^|[.?!:;]\s+)\W*(?:how\s+(?:do|does|can|could|should|would|will|to)\b|why\b"
    r"|what\s+(?:does|do)\b[^?]*\b(?:do|mean)\b|what(?:'s|\s+is|\s+are)\s+an?\s+[^?.]{1,40}\?"
    r"|can\s+i\b|is\s+there\s+a\s+way\b|(?:explain|describe|show\s+me)\b)"
    r"|\b(?:I|my|me|I'm|I've|I'd)\b|\bdifference\s+between\b|\bgood\s+for\b",
    re.I,
)


# a capital "I" that is a name's numeral ("Philip I", "World War I", "NCAA division I"), not
# the asker: after a capitalised word that does not begin the question or a sentence, or
# ending a clause ("... division I?", "Super Bowl I and II")
_NUMERAL_BEFORE = re.compile(r"[^\s.?!:;\"'(]\s+[A-Z][\w-]*\s+$")
_NUMERAL_AFTER = re.compile(r"\s*(?:[?.,;)]|$|\s(?:and|or)\b)")


def asks_how(question: str) -> bool:
    """Whether ``question`` asks how to do something, why, what something does or means, or
    about the asker's own case ("How do I ...", "Why ...", "What does ... do", "What is a ...",
    "My build fails ..."), not for one fact ("Who", "When", "How many", "What is the ... of",
    "When did Philip I …"): the questions whose written answer gets quotes
    (:func:`quotations`)."""
    return any(
        m.group(0) != "I"
        or not (
            _NUMERAL_BEFORE.search(question[: m.start()]) or _NUMERAL_AFTER.match(question, m.end())
        )
        for m in _ASKS_HOW.finditer(question)
    )


MAX_QUOTE_WORDS = 80  # a longer quote is cut (an example after its "::" line may be long)
MIN_QUOTE_WORDS = 3  # a unit with fewer content words is a heading or a fragment, not a quote


def _cut_words(text: str, limit: int) -> str:
    """``text`` cut to its first ``limit`` words (``…`` marks the cut)."""
    words = text.split()
    return text if len(words) <= limit else " ".join(words[:limit]) + " …"


def _clip(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    """``text`` cut at a word boundary to about ``budget`` tokens (one unit over the budget)."""
    if count_tokens(text) <= budget:
        return text
    words = text.split()
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(" ".join(words[:mid])) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + " …"
