"""Grounded-QA examples mined from a user's own documents, without a teacher model.

SQuAD teaches the answer format on encyclopaedia prose; a user's corpus is documentation, whose
passages are reST/markdown chunks with headings. This module turns that structure into examples
in the same :class:`~training.lora_data.QAExample` form, so LoRA also sees the pipeline's real
passages (as :mod:`training.pairs` mines heading → section pairs for the retriever):

* **sections**: every heading of a file loaded by :mod:`rag.documents` opens a section that runs
  to the next heading (as :mod:`rag.chunking` cuts them); the passage is the section's raw text
  from the heading line on, cut to its first ``passage_words`` words: the chunk the pipeline would
  retrieve, markup and all;
* **question** from the heading path, by one of five fixed templates (:func:`make_question`):
  an FAQ heading ending in ``?`` is the question; ``:mod:`x` --- ...`` gives "What is the x
  module?"; a heading opening with a common verb ("Install a package") or its gerund ("Creating
  tasks") gives "How do I install a package?" / "How do I create tasks?"; a short term or
  ``Term: description`` heading gives "What is/are <term>?"; anything else, and every heading
  that is generic ("Examples") or not unique in the corpus, gives
  ``What does the "<heading>" section of <document title> cover?``;
* **target**: the first one or two complete sentences of the section's first prose paragraph
  inside the passage window (directives, literal blocks, tables, lists and field lists are
  skipped; a section opening with the intro to a code block or list gives none), cleaned of
  markup by :func:`clean_inline` (``:func:`open``` → ``open``, link and emphasis markup dropped,
  inline code kept in single backticks) and followed by the gold passage's ``[n]``. A section
  with no such sentence gives no example (it can still be a distractor);
* **distractors**: k-1 sections of *other* files ranked by BM25 for the question (never one with
  the same heading, naming a term question's term in its headings, or repeating the answer's
  opening words), with the gold at a uniformly drawn, exactly balanced position; a
  ``refusal_fraction`` of examples drop the gold and take k distractors, with target
  :data:`rag.prompt.REFUSAL`.

Why no teacher: the lead sentences of a documentation section state what it is about almost by
convention, so they are an extractive, checkable answer to "what does this section cover" — no
LLM to run, no invented text. The cost is question variety (five templates) and that a distractor
may occasionally cover the same topic; the filters above only make that rare.
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rag.bm25 import BM25Index
from rag.documents import Document, load_documents
from rag.prompt import REFUSAL, format_target
from training.lora_data import QAExample, _gold_positions, trim_passage

DOC_PASSAGE_WORDS = 180  # about the pipeline's 256-token chunk
MIN_SECTION_WORDS = 20  # shorter sections (a bare heading) are neither gold nor distractor
MAX_LEAD_WORDS = 60  # a second sentence is added only while the answer stays this short

# Verbs whose imperative ("Install ...") or gerund ("Installing ...") heading reads as a task.
VERBS = frozenset(
    ("access", "add", "build", "call", "change", "check", "close", "compile", "configure",
     "connect", "convert", "copy", "create", "customize", "customise", "debug", "define", "delete",
     "deploy", "disable", "embed", "enable", "extend", "find", "format", "get", "handle",
     "implement", "import", "install", "integrate", "link", "load", "log", "make", "manage",
     "migrate", "monitor", "move", "open", "parse", "pass", "port", "raise", "read", "receive",
     "register", "remove", "render", "run", "save", "search", "send", "set", "sort", "specify",
     "start", "stop", "store", "test", "upgrade", "update", "use", "work", "write")
)  # fmt: skip
# Headings that name a kind of section rather than a topic: asked about with the document title.
GENERIC = frozenset(
    ("about", "introduction", "overview", "examples", "example", "summary", "notes", "note",
     "details", "background", "contents", "references", "reference", "description", "usage",
     "api", "functions", "classes", "methods", "attributes", "constants", "exceptions", "removed",
     "deprecated", "changes", "acknowledgements", "footnotes", "glossary", "index", "tutorial",
     "faq", "see also", "new features", "new modules", "improved modules", "other changes",
     "other language changes", "optimizations")
)  # fmt: skip

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(`\"'])")
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:._])\1{2,}\s*$")
_TERM_SPLIT = re.compile(r"\s+(?:---|--|—|–)\s+|:\s+")
_SKIP_LINE = re.compile(r"^(\.\.|:[\w -]+:(\s|$)|[+|#><]|=+\s+=|[-*+$]\s|\d+[.)]\s|```|~~~)")


@dataclass
class Section:
    """Text from one heading to the next, with the heading path that governs it."""

    id: str  # "<file>#<heading index>"
    path: str  # the file
    headings: tuple[str, ...]  # raw heading titles, top level first
    text: str  # raw text from the heading line on (what the pipeline's chunk would hold)
    rst: bool  # reStructuredText markup (else markdown / plain text)


# ---------------------------------------------------------------------------- markup → plain text


def _role(m: re.Match) -> str:
    name, inner = m.group(1).lower(), m.group(2).strip()
    if name in (":pep:", ":rfc:"):
        return f"{name.strip(':').upper()} {inner.split('#')[0]}"
    titled = re.match(r"^(.*?)\s*<[^<>]+>$", inner, flags=re.S)
    if titled and titled.group(1):
        return titled.group(1)
    inner = inner.lstrip("!")
    return inner[1:].rsplit(".", 1)[-1] if inner.startswith("~") else inner


def _outside_code(text: str, fn) -> str:
    """Apply ``fn`` to the parts of ``text`` outside single-backtick code spans."""
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def _unmark(text: str, rst: bool) -> str:
    """Links, substitutions, footnote references and emphasis of code-free text → plain text."""
    if rst:
        text = re.sub(r"\|([^|\s][^|]*)\|_{0,2}", r"\1", text)
        text = re.sub(r"\s*\[[#*\w-]*\]_", "", text)
        text = text.replace("\\ ", "").replace("\\*", "*").replace("\\", "")
        text = re.sub(r"(?<=[A-Za-z0-9])_(?=[\s.,;:)]|$)", "", text)  # ``name_`` references
    else:
        text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)
        text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)
        text = re.sub(r"(?<!\w)__(\S.*?)__(?!\w)", r"\1", text)
        text = re.sub(r"(?<!\w)_(\S[^_]*?)_(?!\w)", r"\1", text)
    text = re.sub(r"\*\*(\S.*?)\*\*", r"\1", text)
    text = re.sub(r"(?<![\w*])\*(\S[^*]*?)\*(?![\w*])", r"\1", text)
    return re.sub(r"(?<=\w) +(?=[).,;:!?]+(\s|$))", "", text)  # space left by a removed reference


def clean_inline(text: str, rst: bool = True) -> str:
    """Inline markup of one paragraph → readable text: reST roles → their text (``~a.b`` → ``b``,
    ``title <target>`` → ``title``), double-backtick literals → single-backtick code (left
    untouched inside), links, substitutions, footnote references and emphasis unmarked; markdown
    links → their text, images dropped. Whitespace is collapsed."""
    text = " ".join(text.split())
    if rst:
        text = re.sub(r"(:(?:[\w.+-]+:)+)`([^`]+)`", _role, text)
        text = re.sub(r"`([^`<]+?)\s*<[^<>`]+>`__?", r"\1", text)
        text = re.sub(r"(?<!`)`([^`]+)`__?(?!`)", r"\1", text)
        text = re.sub(r"(\S)\s*::$", r"\1:", text)
    text = re.sub(r"``(.+?)``", lambda m: "`" + m.group(1).replace("`", "") + "`", text)
    return " ".join(_outside_code(text, lambda t: _unmark(t, rst)).split())


def _prose_paragraphs(body: str) -> list[str]:
    """Blank-line separated paragraphs that are plain prose: none indented (directive bodies,
    literal blocks, quotes), none opening as a directive, comment, field list, table, list,
    heading, quote, fence or HTML tag, none containing an underline."""
    out = []
    for para in re.split(r"\n\s*\n", body):
        lines = para.strip("\n").split("\n")
        if not lines[0].strip() or lines[0][:1].isspace() or _SKIP_LINE.match(lines[0]):
            continue
        if any(_UNDERLINE.match(ln) or ln[:1].isspace() for ln in lines[1:]):
            continue  # a heading, or a definition list / directive with an indented body
        out.append(para)
    return out


def lead_sentences(section: Section, passage_words: int) -> str:
    """The first one or two complete sentences of the first prose paragraph that lies within the
    passage window (the first ``passage_words`` words; 0 = all), cleaned of markup; "" if none.
    A sentence must end in ``.``, ``!`` or ``?`` (so a cut-off one never counts); paragraphs whose
    first sentence has under five words are passed over, and a section whose first real
    paragraph introduces a code block or list (``...:``) or continues one (lower-case start)
    gives no lead at all: what follows depends on the code."""
    text = section.text
    ends = [m.end() for m in re.finditer(r"\S+", text)] if passage_words else []
    if len(ends) > passage_words:
        text = text[: ends[passage_words - 1]]
    body = text.split("\n", 1)[1] if "\n" in text else ""
    if body and _UNDERLINE.match(body.split("\n", 1)[0]):
        body = body.split("\n", 1)[1] if "\n" in body else ""
    for para in _prose_paragraphs(body):
        sents = _SENTENCE.split(clean_inline(para, section.rst))
        if len(sents[0].split()) < 5:
            continue  # a label such as "Source code: Lib/os.py"
        if not sents[0].endswith((".", "!", "?")) or not re.match(r"[A-Z0-9`\"'(]", sents[0]):
            return ""  # opens with an intro to a code block or list, or continues one
        lead, nxt = sents[0], sents[1] if len(sents) > 1 else ""
        if nxt.endswith((".", "!", "?")) and len(f"{lead} {nxt}".split()) <= MAX_LEAD_WORDS:
            lead = f"{lead} {nxt}"
        return lead
    return ""


# ---------------------------------------------------------------------------- questions


@functools.lru_cache(maxsize=65536)
def plain_heading(title: str) -> str:
    """A heading as words: markup cleaned, backticks dropped (cached: distractor filtering asks
    for the same headings many times)."""
    return clean_inline(title).replace("`", "").strip()


def _lower_words(text: str, body: str = "") -> str:
    """``text`` with its Title-case words lowered for mid-sentence use ("Binary Data Services" →
    "binary data services"), except proper nouns: words ``body`` writes capitalised between
    lower-case words ("Python basics" stays)."""
    words = text.split()
    for i, w in enumerate(words):
        title_case = w[:1].isupper() and w[1:].islower() and w[1:].isalpha()
        if title_case and not re.search(rf"\b[a-z]+[,;]? {re.escape(w)} [a-z]", body):
            words[i] = w.lower()
    return " ".join(words)


def _is_plural(term: str) -> bool:
    """A crude English plural test for "what is/are": "X and Y", "APIs", "indexes"."""
    last = term.split()[-1]
    if " and " in term or re.fullmatch(r"[A-Z]{2,}s", last):
        return True
    last = last.lower()
    return last.endswith("s") and not last.endswith(("ss", "us", "is", "ys"))


def _verb_base(word: str) -> str | None:
    """``word`` if it is one of :data:`VERBS`, or the verb of its gerund (creating → create)."""
    w = word.lower()
    if w in VERBS:
        return w
    if w.endswith("ing") and len(w) > 5:
        stem = w[:-3]
        for base in (stem, stem + "e", stem[:-1] if stem[-1:] == stem[-2:-1] else ""):
            if base in VERBS:
                return base
    return None


def _task(words: list[str], body: str) -> str | None:
    """The question "How do I ...?" for a heading opening with a verb or its gerund ("Compiling
    and Linking X" → "How do I compile and link X?"); None for any other heading, "Use of X", or
    a gerund after "and" that is no known verb."""
    base = _verb_base(words[0]) if words[1:2] != ["of"] else None
    for i in range(2, len(words) if base else 0):
        if words[i - 1] in ("and", "or") and words[i].lower().endswith("ing"):
            words = [*words[:i], _verb_base(words[i]) or "", *words[i + 1 :]]
            base = base if words[i] else None
    return (
        f"How do I {base} {_lower_words(' '.join(words[1:]), body)}".rstrip() + "?"
        if base
        else None
    )


def make_question(headings: Sequence[str], unique: bool = True, body: str = "") -> tuple[str, str]:
    """(question, term) for a section's heading path; ``term`` is the named thing for "what is"
    questions ("" otherwise), used to keep sections about it out of the distractors. ``unique``
    says whether the last heading occurs once in the corpus (else the generic template); ``body``
    (the section text) tells proper nouns, which keep their capital, from Title Case."""
    raw, h, title = headings[-1], plain_heading(headings[-1]), plain_heading(headings[0])
    if h.endswith("?"):
        return h, ""
    words = h.split()
    if unique and h.lower() not in GENERIC and words:
        if raw.lstrip().startswith(":mod:"):
            term = _TERM_SPLIT.split(h, maxsplit=1)[0]
            return f"What is the {term} module?", term
        if task := _task(words, body):
            return task, ""
        parts = _TERM_SPLIT.split(h, maxsplit=1)
        term = parts[0] if len(parts) == 2 else h
        gerund = len(words) > 1 and words[0].lower().endswith("ing")  # "Integrating X": no term
        if len(term.split()) <= 3 and not gerund:
            verb = "are" if _is_plural(term) else "is"
            return f"What {verb} {_lower_words(term, body)}?", term
    if len(headings) > 1 and title and title != h:
        return f'What does the "{h}" section of {title} cover?', ""
    return f"What does {_lower_words(h, body)} cover?", ""


# ---------------------------------------------------------------------------- sections + examples


def doc_sections(docs: Sequence[Document]) -> list[Section]:
    """One :class:`Section` per heading of ``docs`` with at least :data:`MIN_SECTION_WORDS`
    words; a file without headings is one untitled section (a distractor only)."""
    out = []
    for doc in docs:
        name = Path(doc.path).name.lower()
        rst = name.endswith((".rst", ".rst.txt"))
        cuts = [h.offset for h in doc.headings]
        if not cuts and len(doc.text.split()) >= MIN_SECTION_WORDS:
            out.append(Section(f"{doc.path}#0", doc.path, (), doc.text, rst))
        for i, h in enumerate(doc.headings):
            end = cuts[i + 1] if i + 1 < len(cuts) else len(doc.text)
            text = doc.text[h.offset : end].strip()
            if len(text.split()) >= MIN_SECTION_WORDS:
                path = doc.heading_path_at(h.offset)
                out.append(Section(f"{doc.path}#{i}", doc.path, path, text, rst))
    return out


def _related(cand: Section, gold: Section, heading: str, term: str) -> bool:
    """True if ``cand`` may answer ``gold``'s question: same file, same last heading, or (for a
    term question) the term among its headings."""
    if cand.path == gold.path:
        return True
    if not cand.headings:  # an untitled file: nothing to match
        return False
    if plain_heading(cand.headings[-1]).lower() == heading:
        return True
    low = " ".join(plain_heading(t) for t in cand.headings).lower()
    return bool(term) and re.search(rf"(?<!\w){re.escape(term.lower())}(?!\w)", low) is not None


def _pick(
    cands: list[Section], need: int, key: str, rng: random.Random, plain: dict[str, str]
) -> list[Section]:
    """``need`` distractors, drawn at random from the best ``2 * need`` candidates (deeper ones
    only as a fallback), skipping any whose passage, as plain text, contains ``key`` (the opening
    of the gold answer: a file that repeats it would make a second right passage)."""
    if not need:
        return []
    top = rng.sample(cands[: 2 * need], min(2 * need, len(cands)))
    out = []
    for s in top + cands[2 * need :]:
        if len(out) == need:
            break
        if s.id not in plain:
            plain[s.id] = clean_inline(s.text, s.rst).replace("`", "")
        if key.replace("`", "") not in plain[s.id]:
            out.append(s)
    return out


def doc_examples(
    paths: Sequence[str | Path],
    n: int,
    k: int = 3,
    refusal_fraction: float = 0.15,
    seed: int = 0,
    passage_words: int = DOC_PASSAGE_WORDS,
) -> list[QAExample]:
    """``n`` examples (0 = one per usable section) from the documents under ``paths``: question
    from the heading path, gold = the section, k-1 BM25 distractor sections of other files, the
    gold at a balanced random position; ``round(n * refusal_fraction)`` of them without the gold,
    answered with the refusal. ``passage_words`` cuts every passage (0 = whole sections)."""
    if k < 1:
        raise ValueError(f"--k-passages must be at least 1, not {k}")
    docs, errors = load_documents(paths)
    sections = doc_sections(docs)
    if not sections:
        raise ValueError(
            f"no section of at least {MIN_SECTION_WORDS} words under {', '.join(map(str, paths))}"
            f" ({len(errors)} file(s) unreadable)"
        )
    rng = random.Random(seed)
    counts = Counter(plain_heading(s.headings[-1]).lower() for s in sections if s.headings)
    golds = []
    for s in sections:
        lead = lead_sentences(s, passage_words) if s.headings else ""
        if lead:
            unique = counts[plain_heading(s.headings[-1]).lower()] == 1
            golds.append((s, lead, *make_question(s.headings, unique, s.text)))
    rng.shuffle(golds)
    golds = golds[:n] if n > 0 else golds
    refuse = set(rng.sample(range(len(golds)), round(len(golds) * refusal_fraction)))
    positions = _gold_positions(len(golds) - len(refuse), k, rng)
    index = BM25Index(
        [s.id for s in sections],
        [" ".join(plain_heading(t) for t in s.headings) + " " + s.text for s in sections],
    )
    by_id = {s.id: s for s in sections}
    plain: dict[str, str] = {}  # section id -> its passage as plain text, filled on demand
    hits = index.search_many([q for _, _, q, _ in golds], k=4 * k + 20)
    out = []
    for i, ((gold, lead, question, term), row) in enumerate(zip(golds, hits)):
        heading = plain_heading(gold.headings[-1]).lower()
        need = k if i in refuse else k - 1
        cands = [by_id[j] for j, _ in row if not _related(by_id[j], gold, heading, term)]
        if len(cands) < need:  # BM25 found too few: fill with random unrelated sections
            have = {s.id for s in cands}
            for s in rng.sample(sections, len(sections)):
                if len(cands) >= need:
                    break
                if s.id not in have and not _related(s, gold, heading, term):
                    cands.append(s)
                    have.add(s.id)
        docs_ = _pick(cands, need, " ".join(lead.split()[:8]), rng, plain)
        cited: list[int] = []
        if i not in refuse:
            pos = min(positions.pop(), len(docs_))
            docs_.insert(pos, gold)
            cited = [pos + 1]
        out.append(
            QAExample(
                id=gold.id,
                question=question,
                passages=[trim_passage(s.text, passage_words) for s in docs_],
                cited=cited,
                answers=[lead],
                target=format_target(lead, cited) if cited else REFUSAL,
                article=gold.path,
                answerable=bool(cited),
                passage_ids=[s.id for s in docs_],
                kind="doc",
            )
        )
    return out
