"""Training pairs for contrastive fine-tuning: (anchor, positive) texts that should embed close.

Two sources, mixable:

* **unsupervised**, mined from any document set, so a retriever adapts to a user's own documents
  without labels: independent cropping of two random spans of one passage (Contriever, Izacard
  et al. 2022), inverse cloze (a sentence -> its passage with the sentence removed; Lee et al.
  2019), and heading -> section text where documents have headings. A BEIR ``corpus.jsonl``
  (e.g. the SciFact abstracts) is accepted as a document set too;
* **supervised**, where labels exist: SciFact train claims -> their abstracts and SQuAD questions
  -> their paragraphs, read through :mod:`rag.evaluation.datasets`. The fixed dev splits (20% of SciFact
  queries, :data:`~rag.evaluation.datasets.SQUAD_DEV_ARTICLES`) are never used; :func:`assert_no_dev`
  checks it again on the final list.

Every pair carries the id of the passage both sides came from (``source``), which tests use to
check that the two sides really share a passage. Why hand-written: the mining recipes are short
and ours; sentence-transformers has no miner for unlabelled documents.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rag.documents import Document, load_documents
from rag.evaluation.datasets import (
    load_beir,
    load_squad,
    load_squad_paragraphs,
    scifact_split,
    squad_split,
)

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\"'])")
_UNDERLINE = re.compile(r"^\s*([=\-~^\"'`#*+_:.])\1{2,}\s*$")


@dataclass
class Pair:
    """One training pair; ``negative`` is an optional hard negative (BM25 or self-mined)."""

    anchor: str
    positive: str
    kind: str  # crop | ict | heading | scifact | squad | file
    source: str  # id of the passage (or document) both sides come from
    negative: str | None = None


@dataclass
class Passage:
    """A span of a document, a few paragraphs long, with the heading path that governs it."""

    id: str
    text: str
    headings: tuple[str, ...] = ()


# ---------------------------------------------------------------------------- documents → passages


def split_passages(doc: Document, max_words: int = 180, min_words: int = 24) -> list[Passage]:
    """Pack a document's blank-line-separated paragraphs into passages of at most ``max_words``
    (a long paragraph is cut at word boundaries). A new heading path starts a new passage, so a
    passage never straddles sections; passages under ``min_words`` are dropped."""
    out: list[Passage] = []
    words: list[str] = []
    path: tuple[str, ...] = ()

    def flush() -> None:
        if len(words) >= min_words:
            out.append(Passage(f"{doc.path}#{len(out)}", " ".join(words), path))
        words.clear()

    for m in re.finditer(r"\S.*?(?=\n\s*\n|\Z)", doc.text, flags=re.S):
        para_path = doc.heading_path_at(m.start())
        if para_path != path:
            flush()
            path = para_path
        lines = m.group(0).splitlines()
        para = " ".join(ln for ln in lines if not _UNDERLINE.match(ln)).split()
        while para:
            room = max_words - len(words)
            words.extend(para[:room])
            para = para[room:]
            if len(words) >= max_words:
                flush()
    flush()
    return out


def beir_documents(corpus_jsonl: str | Path) -> list[Document]:
    """A BEIR ``corpus.jsonl`` as documents (title as a level-1 heading), one per line."""
    path = Path(corpus_jsonl)
    docs = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                title, text = row.get("title") or "", row.get("text") or ""
                docs.append(Document(path=f"{path}:{row['_id']}", text=text, headings=[]))
                if title:
                    docs[-1].text = f"{title}\n\n{text}"
    return docs


def load_doc_sources(sources: Sequence[str | Path]) -> list[Document]:
    """Documents from folders/files (via :mod:`rag.documents`) and BEIR ``*.jsonl`` corpora."""
    docs: list[Document] = []
    for src in sources:
        if str(src).endswith(".jsonl"):
            docs.extend(beir_documents(src))
        else:
            loaded, _errors = load_documents([src])
            docs.extend(loaded)
    return docs


# ---------------------------------------------------------------------------- unsupervised miners


def _span(words: list[str], rng: random.Random, lo: float, hi: float) -> str:
    n = max(4, int(len(words) * rng.uniform(lo, hi)))
    s = rng.randint(0, max(0, len(words) - n))
    return " ".join(words[s : s + n])


def crop_pairs(
    passages: Sequence[Passage], rng: random.Random, lo: float = 0.1, hi: float = 0.5
) -> list[Pair]:
    """Contriever's independent cropping: two random spans, each ``lo``–``hi`` of the passage."""
    out = []
    for p in passages:
        words = p.text.split()
        out.append(Pair(_span(words, rng, lo, hi), _span(words, rng, lo, hi), "crop", p.id))
    return out


def ict_pairs(
    passages: Sequence[Passage], rng: random.Random, min_sentence_words: int = 5
) -> list[Pair]:
    """Inverse cloze: a random sentence -> its passage with that sentence removed."""
    out = []
    for p in passages:
        sents = _SENTENCE.split(p.text)
        idx = [i for i, s in enumerate(sents) if len(s.split()) >= min_sentence_words]
        if len(sents) < 3 or not idx:
            continue
        i = rng.choice(idx)
        out.append(Pair(sents[i], " ".join(sents[:i] + sents[i + 1 :]), "ict", p.id))
    return out


def heading_pairs(passages: Sequence[Passage], min_title_words: int = 2) -> list[Pair]:
    """Heading path -> the first passage under it (one pair per distinct heading path)."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for p in passages:
        if not p.headings or p.headings in seen or len(p.headings[-1].split()) < min_title_words:
            continue
        seen.add(p.headings)
        body = p.text
        for title in p.headings:  # the passage may open with its own heading lines: drop them
            body = body.removeprefix(title).lstrip()
        if len(body.split()) >= 8:
            out.append(Pair(" > ".join(p.headings[-2:]), body, "heading", p.id))
    return out


def unsupervised_pairs(
    docs: Sequence[Document],
    seed: int = 0,
    kinds: Iterable[str] = ("crop", "ict", "heading"),
    max_words: int = 180,
    max_pairs: int | None = None,
) -> list[Pair]:
    """All unsupervised pairs of ``docs``, shuffled; at most ``max_pairs`` (balanced by kind)."""
    rng = random.Random(seed)
    passages = [p for d in docs for p in split_passages(d, max_words=max_words)]
    miners = {"crop": lambda: crop_pairs(passages, rng), "ict": lambda: ict_pairs(passages, rng)}
    miners["heading"] = lambda: heading_pairs(passages)
    by_kind = [miners[k]() for k in kinds]
    for lst in by_kind:
        rng.shuffle(lst)
    if max_pairs is not None:
        by_kind = _balance(by_kind, max_pairs)
    out = [p for lst in by_kind for p in lst]
    rng.shuffle(out)
    return out


def _balance(lists: list[list[Pair]], total: int) -> list[list[Pair]]:
    """Cut lists to ``total`` items together, giving each kind an equal share where it can."""
    quota = [0] * len(lists)
    left = total
    while left > 0 and any(q < len(lst) for q, lst in zip(quota, lists)):
        for i, lst in enumerate(lists):
            if left > 0 and quota[i] < len(lst):
                quota[i] += 1
                left -= 1
    return [lst[:q] for lst, q in zip(lists, quota)]


# ---------------------------------------------------------------------------- supervised sources


def scifact_pairs(folder: str | Path, split: str = "train") -> list[Pair]:
    """SciFact train claims -> each relevant abstract; the fixed dev 20% are left out."""
    ds = load_beir(folder, split)
    train_ids, dev_ids = scifact_split(ds)
    dev_texts = {ds.queries[q] for q in dev_ids}
    # A few claims occur twice under different ids; a train copy of a dev claim would leak it.
    train_ids = [q for q in train_ids if ds.queries[q] not in dev_texts]
    pairs = [
        Pair(ds.queries[q], ds.doc_text(d), "scifact", f"scifact:{d}")
        for q in train_ids
        for d in ds.qrels.get(q, {})
    ]
    assert_no_dev(pairs, dev_texts=dev_texts)
    return pairs


def squad_pairs(path: str | Path) -> list[Pair]:
    """SQuAD questions -> their paragraph (title + context), train articles only."""
    train_articles, dev_articles = squad_split(path)
    ds = load_squad(path, articles=train_articles)
    pairs = [
        Pair(ds.queries[q], ds.doc_text(d), "squad", f"squad:{d}")
        for q in ds.queries
        for d in ds.qrels[q]
    ]
    dev_texts = {p.context for p in load_squad_paragraphs(path) if p.title in dev_articles}
    assert_no_dev(pairs, dev_texts=dev_texts, dev_sources={f"squad:{t}/" for t in dev_articles})
    return pairs


def squad_dev_texts(path: str | Path) -> set[str]:
    """Paragraph texts and questions of the held-out SQuAD articles (to filter any pair list)."""
    _, dev = squad_split(path)
    out: set[str] = set()
    for p in load_squad_paragraphs(path):
        if p.title in dev:
            out.add(p.context)
            out.update(q.question for q in p.questions)
    return out


def assert_no_dev(
    pairs: Iterable[Pair], dev_texts: set[str] = frozenset(), dev_sources: Iterable[str] = ()
) -> None:
    """Raise if any pair uses a dev text (exactly, or containing a dev paragraph) or a source id
    starting with one of ``dev_sources``; the guard behind "dev splits are never trained on"."""
    prefixes = tuple(dev_sources)
    long_dev = [t for t in dev_texts if len(t) > 200]
    for p in pairs:
        for side in (p.anchor, p.positive):
            if side in dev_texts or any(t in side for t in long_dev):
                raise AssertionError(
                    f"pair from {p.source} ({p.kind}) uses a dev-split text: {side[:80]!r}"
                )
        if prefixes and p.source.startswith(prefixes):
            raise AssertionError(f"pair from {p.source} ({p.kind}) comes from a dev-split article")


# ---------------------------------------------------------------------------- hard negatives, files


def add_bm25_negatives(pairs: list[Pair], seed: int = 0, depth: int = 10) -> list[Pair]:
    """Give each pair a hard negative: a BM25-ranked positive of another source (not one with the
    same source id, which would be a false negative). Uses the project's :class:`BM25Index`."""
    from rag.retrieval.bm25 import BM25Index

    rng = random.Random(seed)
    texts = sorted({p.positive for p in pairs})
    source_of: dict[str, set[str]] = {}
    for p in pairs:
        source_of.setdefault(p.positive, set()).add(p.source)
    index = BM25Index([str(i) for i in range(len(texts))], texts)
    hits = index.search_many([p.anchor for p in pairs], k=depth)
    for p, row in zip(pairs, hits):
        cands = [texts[int(i)] for i, _ in row if p.source not in source_of[texts[int(i)]]]
        p.negative = cands[0] if cands else texts[rng.randrange(len(texts))]
    return pairs


def write_pairs(pairs: Iterable[Pair], path: str | Path) -> None:
    with Path(path).open("w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps(asdict(p), ensure_ascii=False) + "\n")


def read_pairs(path: str | Path) -> list[Pair]:
    """JSONL with ``anchor`` and ``positive`` (optional ``negative``, ``kind``, ``source``)."""
    out = []
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "anchor" not in row or "positive" not in row:
                raise ValueError(f"{path}:{lineno}: a pair needs 'anchor' and 'positive' fields")
            src = row.get("source", f"{path.name}:{lineno}")
            out.append(
                Pair(
                    row["anchor"],
                    row["positive"],
                    row.get("kind", "file"),
                    src,
                    row.get("negative"),
                )
            )
    return out
