"""Training data for the cross-encoder reranker: queries, their positives and mined hard negatives.

Sources (each a :class:`Pool`: queries over a corpus of candidate passages):

* SciFact train claims -> their abstracts, over the whole SciFact corpus;
* SQuAD questions of the *train* articles -> their paragraph, negatives only from train articles;
* optional pairs from the user's documents (inverse-cloze and heading pairs of
  :mod:`training.data.pairs`) and ``{"anchor", "positive"}`` JSONL files.

Hard negatives are what a reranker has to learn to push down: the passages the first stage ranks
high that are not relevant. They are mined with the project's own BM25 and dense retrievers
(:class:`rag.retrieval.retriever.CorpusRetriever`), interleaved so both kinds of mistakes are represented, by
:func:`mine_hard_negatives`, a pure function that never returns a positive (by id or by text).

The fixed dev splits (SciFact's dev 20% of claims, :data:`~rag.evaluation.datasets.SQUAD_DEV_ARTICLES`)
are never trained on: their queries are dropped from every source, their passages are never
candidates, and :func:`assert_no_heldout` checks the final examples again.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.evaluation.datasets import load_beir, load_squad, scifact_split, squad_split
from training.data import pairs as P

Ranking = Sequence[str | tuple[str, float]]


@dataclass
class RerankExample:
    """One query with its relevant passages and mined irrelevant ones (texts)."""

    query: str
    positives: list[str]
    negatives: list[str]
    kind: str  # scifact | squad | pairs | docs
    sources: list[str] = field(default_factory=list)  # ids of every passage used


@dataclass
class Pool:
    """Queries and their positive ids over ``corpus`` (id -> text); negatives may come only from
    ``allowed`` ids (None: the whole corpus)."""

    kind: str
    corpus: dict[str, str]
    queries: list[str]
    positives: list[list[str]]
    allowed: set[str] | None = None
    given: list[list[str]] = field(default_factory=list)  # negatives given with a pair file


@dataclass
class Heldout:
    """What must never be trained on: dev query texts, dev passage texts, dev source prefixes."""

    queries: set[str] = field(default_factory=set)
    passages: set[str] = field(default_factory=set)
    sources: tuple[str, ...] = ()


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


# ---------------------------------------------------------------------------- mining (pure)


def interleave(rankings: Sequence[Ranking]) -> list[str]:
    """Round-robin merge of several rankings (ids or (id, score)), first occurrence kept: the
    first of each, then the second of each, ... so every retriever's top mistakes come first."""
    out: dict[str, None] = {}
    for i in range(max((len(r) for r in rankings), default=0)):
        for r in rankings:
            if i < len(r):
                item = r[i]
                out.setdefault(item if isinstance(item, str) else item[0], None)
    return list(out)


def mine_hard_negatives(
    queries: Sequence[str],
    positives: Sequence[Collection[str]],
    ranked_lists: Sequence[Ranking],
    n: int,
    text_of: Mapping[str, str] | Callable[[str], str] | None = None,
    skip: int = 0,
) -> list[list[str]]:
    """Up to ``n`` negative ids per query, best-ranked first, from its ranked list (ids or
    (id, score) pairs) after skipping the top ``skip`` candidates.

    Never returned: a positive id; with ``text_of``, also a candidate whose text equals (up to
    case and spacing) a positive's or the query's text (duplicated documents are positives in
    all but id), and a second candidate with the same text as one already taken."""
    if not len(queries) == len(positives) == len(ranked_lists):
        raise ValueError(
            f"{len(queries)} queries, {len(positives)} positive sets and "
            f"{len(ranked_lists)} ranked lists: one of each per query"
        )
    get = text_of.__getitem__ if isinstance(text_of, Mapping) else text_of
    out = []
    for query, pos, ranked in zip(queries, positives, ranked_lists):
        pos = set(pos)
        banned = {_norm(query)} | ({_norm(get(p)) for p in pos} if get else set())
        taken: list[str] = []
        seen: set[str] = set()
        for item in list(ranked)[skip:]:
            doc = item if isinstance(item, str) else item[0]
            if len(taken) >= n:
                break
            if doc in pos or doc in seen:
                continue
            seen.add(doc)
            if get:
                text = _norm(get(doc))
                if text in banned:
                    continue
                banned.add(text)
            taken.append(doc)
        out.append(taken)
    return out


# ---------------------------------------------------------------------------- held-out splits


def heldout(scifact: str | Path | None, squad: str | Path | None) -> Heldout:
    """The dev texts of both datasets (those given)."""
    h = Heldout()
    if scifact:
        ds = load_beir(scifact, "train")
        h.queries |= {ds.queries[q] for q in scifact_split(ds)[1]}
    if squad:
        _, dev_articles = squad_split(squad)
        dev = load_squad(squad, articles=dev_articles)
        h.queries |= set(dev.queries.values())
        for d in dev.corpus:
            if dev.doc_group[d] in dev_articles:
                h.passages |= {dev.corpus[d]["text"], dev.doc_text(d)}
        h.sources = tuple(f"squad:{t}/" for t in dev_articles)
    return h


def assert_no_heldout(examples: Sequence[RerankExample], held: Heldout) -> None:
    """Raise if any example's query is a dev query, or any of its passages is a dev passage or
    comes from a dev source: the guard behind "the dev splits are never trained on"."""
    for ex in examples:
        if ex.query in held.queries:
            raise AssertionError(f"{ex.kind} example uses a dev-split query: {ex.query[:80]!r}")
        for text in (*ex.positives, *ex.negatives):
            if text in held.passages:
                raise AssertionError(f"{ex.kind} example uses a dev passage: {text[:80]!r}")
        if held.sources and any(s.startswith(held.sources) for s in ex.sources):
            raise AssertionError(f"{ex.kind} example uses a passage of a dev-split article")


# ---------------------------------------------------------------------------- pools


def _sample(n_total: int, cap: int, seed: int) -> list[int]:
    idx = list(range(n_total))
    if cap and n_total > cap:
        idx = sorted(random.Random(seed).sample(idx, cap))
    return idx


def scifact_pool(folder: str | Path, held: Heldout, cap: int = 0, seed: int = 0) -> Pool:
    """Train claims (minus any whose text is also a dev claim) over the whole corpus."""
    ds = load_beir(folder, "train")
    train = [q for q in scifact_split(ds)[0] if ds.queries[q] not in held.queries]
    train = [train[i] for i in _sample(len(train), cap, seed)]
    corpus = {f"scifact:{d}": ds.doc_text(d) for d in ds.corpus}
    return Pool(
        "scifact",
        corpus,
        [ds.queries[q] for q in train],
        [[f"scifact:{d}" for d in ds.qrels[q]] for q in train],
    )


def squad_pool(path: str | Path, held: Heldout, cap: int = 0, seed: int = 0) -> Pool:
    """Train-article questions over every paragraph; negatives only from train articles."""
    train_articles, _ = squad_split(path)
    ds = load_squad(path, articles=train_articles)
    qids = [q for q in ds.queries if ds.queries[q] not in held.queries]
    qids = [qids[i] for i in _sample(len(qids), cap, seed)]
    corpus = {f"squad:{d}": ds.doc_text(d) for d in ds.corpus}
    allowed = {f"squad:{d}" for d in ds.corpus if ds.doc_group[d] in set(train_articles)}
    positives = [[f"squad:{d}" for d in ds.qrels[q]] for q in qids]
    return Pool("squad", corpus, [ds.queries[q] for q in qids], positives, allowed)


def pairs_pool(pairs: Sequence[P.Pair], kind: str, held: Heldout) -> Pool:
    """Pairs as a pool over their own positives; texts from the same source passage count as
    positives of each other's anchors (an ICT sentence is answered by its whole passage)."""
    pairs = [
        p
        for p in pairs
        if p.anchor not in held.queries
        and p.positive not in held.passages
        and not any(t in p.positive for t in held.passages if len(t) > 200)
    ]
    ids: dict[str, str] = {}
    by_source: dict[str, set[str]] = {}
    for p in pairs:
        i = ids.setdefault(p.positive, f"{kind}:{len(ids)}")
        by_source.setdefault(p.source, set()).add(i)
    corpus = {i: t for t, i in ids.items()}
    return Pool(
        kind,
        corpus,
        [p.anchor for p in pairs],
        [sorted(by_source[p.source] | {ids[p.positive]}) for p in pairs],
        given=[[p.negative] if p.negative else [] for p in pairs],
    )


def mine_pool(
    pool: Pool,
    search: Callable[[list[str], int, str], list[list[tuple[str, float]]]],
    modes: Sequence[str],
    n: int,
    depth: int = 30,
    skip: int = 0,
    seed: int = 0,
    n_random: int = 0,
) -> list[RerankExample]:
    """Examples of ``pool`` with ``n`` hard negatives each, mined from ``search(queries, k,
    mode)`` for every mode in ``modes`` and interleaved; where they run short (tiny corpora),
    random allowed passages fill up. Negatives given with a pair come first. ``n_random`` more
    negatives per query are drawn at random from the allowed passages (never a positive): easy
    contrasts that let a fresh scoring head learn topical relevance before the hard ones."""
    allowed = pool.allowed if pool.allowed is not None else set(pool.corpus)
    fetch = depth if pool.allowed is None else 2 * depth + n
    rankings = [
        [[d for d, _ in row if d in allowed][:depth] for row in search(pool.queries, fetch, m)]
        for m in modes
    ]
    rng = random.Random(seed)
    pool_ids = sorted(allowed)
    ranked = []
    for qi in range(len(pool.queries)):
        fill = rng.sample(pool_ids, min(len(pool_ids), 3 * n + 10))
        ranked.append(interleave([r[qi] for r in rankings]) + fill)
    mined = mine_hard_negatives(pool.queries, pool.positives, ranked, n, pool.corpus, skip)
    if n_random:
        # hard ones first in each list, so the random ones never repeat their texts either
        lists = [
            [*hard, *rng.sample(pool_ids, min(len(pool_ids), 3 * n_random + 10))] for hard in mined
        ]
        both = [
            mine_hard_negatives([q], [p], [row], len(hard) + n_random, pool.corpus)[0]
            for q, p, row, hard in zip(pool.queries, pool.positives, lists, mined)
        ]
        easy = [row[len(hard) :] for row, hard in zip(both, mined)]
    out = []
    for qi, (query, pos, neg) in enumerate(zip(pool.queries, pool.positives, mined)):
        given = pool.given[qi] if pool.given else []
        negatives = [*given, *(pool.corpus[d] for d in neg)][:n] if n else list(given)
        if n_random:
            negatives += [pool.corpus[d] for d in easy[qi]]
            neg = [*neg, *easy[qi]]
        out.append(
            RerankExample(query, [pool.corpus[p] for p in pos], negatives, pool.kind, [*pos, *neg])
        )
    return out


# ---------------------------------------------------------------------------- datasets


def to_dataset(examples: Sequence[RerankExample], loss: str, seed: int = 0) -> Any:
    """A ``datasets.Dataset`` in the column layout the loss expects: ``bce`` one (query, passage,
    label) row per positive and negative; ``mnrl`` one (query, positive, negative_1..n) row per
    positive, every row with the same number of negatives (short lists repeat their last)."""
    from datasets import Dataset

    rng = random.Random(seed)
    if loss == "bce":
        rows = [
            (ex.query, text, float(label))
            for ex in examples
            for label, texts in ((1, ex.positives), (0, ex.negatives))
            for text in texts
        ]
        rng.shuffle(rows)
        q, p, y = zip(*rows) if rows else ((), (), ())
        return Dataset.from_dict({"query": list(q), "passage": list(p), "label": list(y)})
    if loss != "mnrl":
        raise ValueError(f"--loss must be bce or mnrl, not {loss!r}")
    n = max((len(ex.negatives) for ex in examples), default=0)
    data: dict[str, list[str]] = {"query": [], "positive": []}
    data |= {f"negative_{i + 1}": [] for i in range(n)}
    order = [(ex, pos) for ex in examples if ex.negatives for pos in ex.positives]
    rng.shuffle(order)
    for ex, pos in order:
        data["query"].append(ex.query)
        data["positive"].append(pos)
        for i in range(n):
            data[f"negative_{i + 1}"].append(ex.negatives[min(i, len(ex.negatives) - 1)])
    return Dataset.from_dict(data)
