"""Dataset readers, shared by training and evals: BEIR folders and SQuAD JSON, plus fixed dev splits.

Pure readers (no model code). Both formats end up as a :class:`RetrievalDataset`: a corpus of
``{doc_id: {"title", "text"}}``, queries ``{query_id: text}`` and qrels
``{query_id: {doc_id: grade}}``, ids always strings (BEIR conventions). SQuAD additionally keeps
its gold answers per question.

Why hand-written: ``beir`` and ``datasets`` would download or pull heavy dependencies; these
formats are a few lines of JSON each, and we need precise errors naming the file and line.
They live in ``rag`` so that training (which must not import ``evals``) and the evals read the
same splits (docs/architecture.md).
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

SCIFACT_DEV_FRACTION = 0.2
SCIFACT_DEV_SEED = 13
# Fixed held-out SQuAD articles (never trained on): every fifth title of the 38 in the shared file.
SQUAD_DEV_ARTICLES = (
    "1973_oil_crisis",
    "Chloroplast",
    "Economic_inequality",
    "Harvard_University",
    "Jacksonville,_Florida",
    "Normans",
    "Private_school",
    "Super_Bowl_50",
)


class DatasetError(ValueError):
    """A dataset file that is missing or malformed; the message names the file (and line)."""


@dataclass
class RetrievalDataset:
    """Corpus, queries and relevance judgements, with string ids throughout."""

    name: str
    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    answers: dict[str, list[str]] = field(default_factory=dict)  # SQuAD only
    doc_group: dict[str, str] = field(default_factory=dict)  # doc id -> article (SQuAD)

    def subset(self, query_ids: Iterable[str], name: str | None = None) -> RetrievalDataset:
        """The same corpus with only ``query_ids`` as queries."""
        keep = [q for q in query_ids if q in self.queries]
        return RetrievalDataset(
            name=name or self.name,
            corpus=self.corpus,
            queries={q: self.queries[q] for q in keep},
            qrels={q: self.qrels[q] for q in keep if q in self.qrels},
            answers={q: self.answers[q] for q in keep if q in self.answers},
            doc_group=self.doc_group,
        )

    def doc_text(self, doc_id: str) -> str:
        """Title + text, as BEIR evaluates dense and BM25 retrievers."""
        doc = self.corpus[doc_id]
        return f"{doc.get('title', '')} {doc['text']}".strip()


# ---------------------------------------------------------------------------- BEIR


def _read_jsonl(path: Path) -> Iterable[tuple[int, dict]]:
    if not path.is_file():
        raise DatasetError(f"{path}: missing (a BEIR folder needs corpus.jsonl and queries.jsonl)")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{lineno}: bad JSON line ({e.msg})") from None
            if "_id" not in row:
                raise DatasetError(f"{path}:{lineno}: no '_id' field")
            yield lineno, row


def load_beir(folder: str | Path, split: str = "test") -> RetrievalDataset:
    """Read a BEIR folder: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``.

    Only queries that have qrels in ``split`` are kept. Qrels naming an unknown query or document
    id raise :class:`DatasetError`.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(f"{folder}: not a directory (expected a BEIR folder)")
    corpus = {
        str(row["_id"]): {"title": row.get("title") or "", "text": row.get("text") or ""}
        for _, row in _read_jsonl(folder / "corpus.jsonl")
    }
    all_queries = {
        str(row["_id"]): row.get("text") or "" for _, row in _read_jsonl(folder / "queries.jsonl")
    }
    qrels_path = folder / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        have = sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
        raise DatasetError(f"{qrels_path}: missing (splits present: {', '.join(have) or 'none'})")
    qrels: dict[str, dict[str, int]] = {}
    with qrels_path.open(encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        for lineno, row in enumerate(reader, start=1):
            if lineno == 1 and row and row[0] == "query-id":
                continue
            if len(row) < 3:
                raise DatasetError(f"{qrels_path}:{lineno}: expected 3 tab-separated columns")
            qid, did, grade = row[0], row[1], row[2]
            if qid not in all_queries:
                raise DatasetError(f"{qrels_path}:{lineno}: unknown query id {qid!r}")
            if did not in corpus:
                raise DatasetError(f"{qrels_path}:{lineno}: unknown corpus id {did!r}")
            qrels.setdefault(qid, {})[did] = int(grade)
    queries = {q: all_queries[q] for q in all_queries if q in qrels}
    return RetrievalDataset(
        name=f"{folder.name}-{split}", corpus=corpus, queries=queries, qrels=qrels
    )


def scifact_split(
    dataset: RetrievalDataset, seed: int = SCIFACT_DEV_SEED
) -> tuple[list[str], list[str]]:
    """Fixed (train_ids, dev_ids): 20% of the query ids, chosen by ``seed``, are dev."""
    ids = sorted(dataset.queries, key=lambda q: (len(q), q))
    rng = random.Random(seed)
    rng.shuffle(ids)
    n_dev = round(len(ids) * SCIFACT_DEV_FRACTION)
    dev = sorted(ids[:n_dev], key=lambda q: (len(q), q))
    train = sorted(ids[n_dev:], key=lambda q: (len(q), q))
    return train, dev


# ---------------------------------------------------------------------------- SQuAD


@dataclass
class SquadQuestion:
    id: str
    question: str
    answers: list[str]
    answer_starts: list[int] = field(default_factory=list)  # character offset of each answer


@dataclass
class SquadParagraph:
    id: str  # "<title>/<index>"
    title: str
    context: str
    questions: list[SquadQuestion]


def load_squad_paragraphs(path: str | Path) -> list[SquadParagraph]:
    """Every paragraph of a SQuAD v1.1 JSON file, with its questions and gold answers."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: missing (expected SQuAD v1.1 JSON)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}:{e.lineno}: bad JSON ({e.msg})") from None
    if not isinstance(data, dict) or "data" not in data:
        raise DatasetError(f"{path}: no top-level 'data' list (not SQuAD JSON)")
    paragraphs = []
    for article in data["data"]:
        title = article["title"]
        for i, para in enumerate(article["paragraphs"]):
            qs = [
                SquadQuestion(
                    str(qa["id"]),
                    qa["question"],
                    [a["text"] for a in qa.get("answers", [])],
                    [int(a.get("answer_start", -1)) for a in qa.get("answers", [])],
                )
                for qa in para.get("qas", [])
            ]
            paragraphs.append(SquadParagraph(f"{title}/{i}", title, para["context"], qs))
    return paragraphs


def load_squad(path: str | Path, articles: Iterable[str] | None = None) -> RetrievalDataset:
    """SQuAD as retrieval: paragraphs are the corpus (title = article), questions the queries,
    the paragraph a question was asked on its single relevant document. ``articles`` limits the
    queries (not the corpus) to those articles; an unknown title raises :class:`DatasetError`."""
    paragraphs = load_squad_paragraphs(path)
    titles = {p.title for p in paragraphs}
    wanted = set(articles) if articles is not None else titles
    if unknown := sorted(wanted - titles):
        raise DatasetError(f"{path}: unknown article(s) {', '.join(unknown)}")
    corpus, queries, qrels, answers, group = {}, {}, {}, {}, {}
    for p in paragraphs:
        corpus[p.id] = {"title": p.title.replace("_", " "), "text": p.context}
        group[p.id] = p.title
        if p.title not in wanted:
            continue
        for q in p.questions:
            queries[q.id] = q.question
            qrels[q.id] = {p.id: 1}
            answers[q.id] = q.answers
    return RetrievalDataset(Path(path).stem, corpus, queries, qrels, answers, group)


def squad_split(path: str | Path) -> tuple[list[str], list[str]]:
    """(train_articles, dev_articles) of a SQuAD file; dev is :data:`SQUAD_DEV_ARTICLES` where
    present (else every fifth title, so any SQuAD file gets a fixed split)."""
    titles = sorted({p.title for p in load_squad_paragraphs(path)})
    dev = [t for t in titles if t in SQUAD_DEV_ARTICLES] or titles[::5]
    return [t for t in titles if t not in dev], dev


def load_dataset(spec: str, split: str = "test") -> RetrievalDataset:
    """``squad:FILE`` (or a path to a .json file) reads SQuAD; anything else a BEIR folder."""
    if spec.startswith("squad:"):
        return load_squad(spec.removeprefix("squad:"))
    if spec.endswith(".json"):
        return load_squad(spec)
    return load_beir(spec, split)
