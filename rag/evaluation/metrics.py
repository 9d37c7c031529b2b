"""Evaluation metrics as small pure functions.

Retrieval metrics come from ``pytrec_eval`` (the C trec_eval behind BEIR's own evaluator), so
the numbers are comparable with published BEIR tables; we only choose the measures and average
over queries. QA metrics are the official SQuAD v1.1 script's normalisation and token F1, which
is a dozen lines and not worth a dependency. Citation accuracy and refusal rate are ours.

They live in ``rag`` so that the fine-tunes' dev evaluations (training.finetune.lora_eval) and the evals
score with the same code without training importing ``evals`` (docs/architecture.md).

Shapes: ``qrels = {query_id: {doc_id: grade}}``, ``run = {query_id: {doc_id: score}}``.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

import pytrec_eval

# Our name -> (trec_eval measure to request, key pytrec_eval returns, cut applied to the run).
_RETRIEVAL = {
    "ndcg@10": ("ndcg_cut.10", "ndcg_cut_10", None),
    "recall@10": ("recall.10", "recall_10", None),
    "recall@100": ("recall.100", "recall_100", None),
    "map@100": ("map_cut.100", "map_cut_100", None),
    # trec_eval's recip_rank has no cut: MRR@10 is recip_rank over the top-10 of the run.
    "mrr@10": ("recip_rank", "recip_rank", 10),
}
RETRIEVAL_METRICS = tuple(_RETRIEVAL)


def top_k(run: dict[str, dict[str, float]], k: int) -> dict[str, dict[str, float]]:
    """The ``k`` best-scored documents per query (ties broken by doc id, as trec_eval does)."""
    out = {}
    for qid, docs in run.items():
        best = sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        out[qid] = dict(best)
    return out


def per_query_retrieval(
    qrels: dict[str, dict[str, int]],
    run: dict[str, dict[str, float]],
    metrics: Sequence[str] = RETRIEVAL_METRICS,
) -> dict[str, dict[str, float]]:
    """``{metric: {query_id: value}}`` for every judged query; a query with no results scores 0."""
    unknown = [m for m in metrics if m not in _RETRIEVAL]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; have {list(_RETRIEVAL)}")
    qrels = {q: {d: int(g) for d, g in docs.items()} for q, docs in qrels.items() if docs}
    # pytrec_eval silently drops queries missing from the run; give them an empty ranking.
    full_run = {q: {d: float(s) for d, s in run.get(q, {}).items()} for q in qrels}
    out: dict[str, dict[str, float]] = {}
    by_cut: dict[int | None, list[str]] = {}
    for m in metrics:
        by_cut.setdefault(_RETRIEVAL[m][2], []).append(m)
    for cut, names in by_cut.items():
        this_run = top_k(full_run, cut) if cut else full_run
        evaluator = pytrec_eval.RelevanceEvaluator(qrels, {_RETRIEVAL[m][0] for m in names})
        scores = evaluator.evaluate({q: r for q, r in this_run.items() if r})
        for m in names:
            key = _RETRIEVAL[m][1]
            out[m] = {q: scores.get(q, {}).get(key, 0.0) for q in qrels}
    return out


def retrieval_metrics(
    qrels: dict[str, dict[str, int]],
    run: dict[str, dict[str, float]],
    metrics: Sequence[str] = RETRIEVAL_METRICS,
) -> dict[str, float]:
    """Mean over judged queries of nDCG@10, Recall@10/100, MRR@10 and MAP@100."""
    return mean_per_query(per_query_retrieval(qrels, run, metrics))


def mean_per_query(per_query: dict[str, dict[str, float]]) -> dict[str, float]:
    """``{metric: mean}`` of :func:`per_query_retrieval`'s output (0 for no queries)."""
    return {m: (sum(v.values()) / len(v) if v else 0.0) for m, v in per_query.items()}


def exclude_self_hits(run: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Drop a document whose id equals its query's id (BEIR's ``ignore_identical_ids``: in
    corpora where queries are also documents, retrieving yourself is not a hit)."""
    return {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}


# ---------------------------------------------------------------------------- SQuAD


def normalize_answer(text: str) -> str:
    """Official SQuAD v1.1 normalisation: lower-case, drop punctuation and the articles
    a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in gold))


def _f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, gold: Iterable[str]) -> float:
    """Token-overlap F1 after normalisation, the best over the gold answers."""
    return max((_f1(prediction, g) for g in gold), default=0.0)


def squad_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean EM and F1 (as fractions in 0..1) over paired predictions and gold answer lists."""
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions but {len(golds)} gold answer lists")
    n = len(predictions) or 1
    return {
        "em": sum(exact_match(p, g) for p, g in zip(predictions, golds)) / n,
        "f1": sum(f1_score(p, g) for p, g in zip(predictions, golds)) / n,
    }


# ---------------------------------------------------------------------------- grounding


def citation_correct(cited: Sequence[int], gold: Sequence[int] | int) -> bool:
    """An answer's citations are correct when it cites at least one passage and every passage it
    cites holds the answer (``gold``: the number(s) of such passages)."""
    gold_set = {gold} if isinstance(gold, int) else set(gold)
    return bool(cited) and set(cited) <= gold_set


def citation_accuracy(cited: Sequence[Sequence[int]], gold: Sequence[Sequence[int] | int]) -> float:
    """Fraction of answers whose citations are correct (see :func:`citation_correct`)."""
    if len(cited) != len(gold):
        raise ValueError(f"{len(cited)} citation lists but {len(gold)} gold lists")
    if not cited:
        return 0.0
    return sum(citation_correct(c, g) for c, g in zip(cited, gold)) / len(cited)


def refusal_rate(refused: Sequence[bool]) -> float:
    """Fraction of answers that were the fixed refusal."""
    return sum(bool(r) for r in refused) / len(refused) if refused else 0.0
