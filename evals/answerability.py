"""Fit and measure the answerability check (rag.answer.answerability) on SQuAD, by retrieval alone.

Questions from the articles left in the index are answerable; questions from the articles taken
out (``--removed-articles``) are not. For each question the retriever returns the ``k``
passages the pipeline would give the decoder, and the signals are recorded: the best
query-passage cosine, the query's IDF coverage and (``--units``, the default) the best
sentence's score as the answer path's encoder reads them. No decoder runs, so a split costs
a minute or two.

- ``--split train --fit``: fit scikit-learn's LogisticRegression (p(unanswerable) from the
  signals) and pick the threshold that refuses most unanswerable questions while false
  refusals (answerable questions whose passages hold the answer, refused) stay within
  ``--max-false-refusal``; the result's ``model`` is what rag.answer.answerability's
  SENTENCE_MODEL holds (``--no-units``: DEFAULT_MODEL, the two retrieval signals).
- ``--split dev`` (the default): measure the shipped model (or ``--model FILE.json``, a fitted
  result) on the held-out articles: refusal rate on unanswerable questions, false-refusal rate,
  ROC AUC of each signal and of the model.

CLI::

    python -m evals.answerability --squad ../shared/data/squad/squad-v1.1-dev-part.json \\
        --split train --fit --out artifacts/evals/answerability-train.json
    python -m evals.answerability --squad ../shared/data/squad/squad-v1.1-dev-part.json \\
        --model artifacts/evals/answerability-train.json

The retrieval settings are a :class:`rag.config.RAGConfig` (``AnswerabilityEvalConfig.rag``) with
the sections' flags (:mod:`evals.pipeline_flags`: ``--mode``, or its older name ``--retriever``,
``--k``, ``--encoder``, ``--device``), starting from :data:`EVAL_DEFAULTS` and never read from a
``rag.toml``; the others are :data:`EXCLUDED`: the paragraphs are searched with fixed settings and
nothing is decoded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from evals.pipeline_flags import Alias, EvalConfig, PipelineFlags, squad_search_excluded
from evals.qa import ParagraphRetriever, holds_answer, removed_articles, select_questions
from rag.answer.answerability import AnswerabilityModel, best_dense, model_for
from rag.answer.evidence import best_unit, read_units
from rag.cli.flags import run_config_cli
from rag.cli.progress import track
from rag.config import RAGConfig, section_fields
from rag.defaults import MODES
from rag.evaluation.datasets import load_squad_paragraphs, squad_split
from rag.retrieval.embedding_cache import EmbeddingCache

_FIXED_SEARCH = (
    "the SQuAD paragraphs are searched with fixed settings (evals.qa.ParagraphRetriever: RRF "
    "fusion, no rerank), as the shipped model was fitted"
)
_NO_ANSWER = (
    "nothing is answered: the eval records the two retrieval signals the check reads "
    "(--fit fits its model and threshold, --model measures a fitted one)"
)
# Pipeline settings the eval fixes itself (setting -> why it has no flag).
EXCLUDED: dict[str, str] = {
    **squad_search_excluded(_FIXED_SEARCH),
    **dict.fromkeys(section_fields("answer"), _NO_ANSWER),
    **dict.fromkeys(section_fields("generate"), "no decoder runs: retrieval alone"),
}
# Where the eval starts other than the sections' defaults (hybrid, k = 5: the pipeline's).
EVAL_DEFAULTS: dict[str, Any] = {"encoder": "minilm"}
PIPELINE = PipelineFlags(
    EXCLUDED,
    EVAL_DEFAULTS,
    aliases={"retriever": Alias("mode", "the same as --mode (dense | hybrid here)", MODES)},
    help={
        "mode": "retrieval mode: dense | hybrid (the check needs a dense score)",
        "k": "passages per question, as the pipeline gives the decoder",
        "encoder": "encoder alias or folder of the paragraphs and the questions",
    },
)


@dataclass
class AnswerabilityEvalConfig(EvalConfig):
    """One fit or measurement; every field (and every retrieval setting) is written to the
    output JSON."""

    PIPELINE: ClassVar[PipelineFlags] = PIPELINE

    squad: str = ""  # SQuAD v1.1 JSON file
    articles: list[str] = field(default_factory=list)  # article titles; empty = --split's
    split: str = "dev"  # dev (held-out: report here) | train (fit here)
    fit: bool = False  # fit the model and pick the threshold on these questions
    model: str | None = None  # a fitted result JSON to measure; none = the shipped model
    removed_articles: int = 2  # articles taken out of the index (their questions: unanswerable)
    limit: int = 300  # answerable questions (seeded sample); 0 = all
    unanswerable_limit: int = 100  # questions asked from the removed articles
    seed: int = 0  # question sample and removed articles (as evals.qa)
    max_false_refusal: float = 0.05  # --fit: the false-refusal limit the threshold keeps
    # the third signal, the best sentence's score in the k passages as the answer path reads
    # them (rag.answer.evidence.read_units); off: the two retrieval signals alone, the model
    # that decides when no excerpts are read
    units: bool = True
    embedding_cache: bool = True  # paragraph vectors from / into $RAG_HOME/cache/embeddings
    # the retrieval settings (mode, k, encoder, device): EVAL_DEFAULTS, then the flags
    rag: RAGConfig = field(default_factory=PIPELINE.config)


def signals(cfg: AnswerabilityEvalConfig, encoder=None, progress: bool = True) -> list[dict]:
    """Per question: answerable, whether its passages hold the answer, dense, coverage and
    (``cfg.units``) unit, the best sentence's score."""
    ret = cfg.rag.retrieval
    if ret.mode not in ("dense", "hybrid"):
        raise ValueError(f"--mode (--retriever) must be dense or hybrid, not {ret.mode!r}")
    paragraphs = load_squad_paragraphs(cfg.squad)
    articles = cfg.articles or squad_split(cfg.squad)[cfg.split == "dev"]
    removed = removed_articles(articles, cfg.removed_articles, cfg.seed)
    asked = select_questions(
        paragraphs, [a for a in articles if a not in removed], cfg.limit, cfg.seed
    )
    unanswerable = select_questions(paragraphs, removed, cfg.unanswerable_limit, cfg.seed)
    if encoder is None:
        from rag.models import load_embedder

        if not ret.encoder:
            raise ValueError("--encoder: the check needs an encoder's dense score, not none")

        encoder = load_embedder(ret.encoder, device=cfg.rag.device)
    kept = [p for p in paragraphs if p.title not in set(removed)]
    cache = EmbeddingCache() if cfg.embedding_cache else None
    retriever = ParagraphRetriever(kept, ret.mode, encoder, cache)
    rows = []
    for q in track(asked + unanswerable, "answerability", unit="question", enabled=progress):
        hits = retriever.search(q.text, ret.k)
        answerable = q.paragraph.rsplit("/", 1)[0] not in removed
        rows.append(
            {
                "id": q.id,
                "question": q.text,
                "answerable": answerable,
                "holds_answer": answerable
                and any(
                    h.chunk.id == q.paragraph or holds_answer(h.chunk.text, q.answers) for h in hits
                ),
                "dense": best_dense(hits),
                "coverage": retriever.coverage(q.text, hits),
                "unit": unit_signal(retriever.encoder, q.text, hits) if cfg.units else None,
            }
        )
    return rows


def unit_signal(encoder: Any, question: str, hits: list) -> float | None:
    """The best sentence's score in ``hits``, read as the answer path reads them."""
    return best_unit(read_units(encoder, question, [h.chunk.text for h in hits]), len(hits))


def probabilities(model: AnswerabilityModel, rows: list[dict]) -> list[float]:
    """p(unanswerable) of each row's signals."""
    return [model.probability(r["dense"], r["coverage"], r.get("unit")) for r in rows]


def rates(rows: list[dict], probs: list[float], threshold: float) -> dict[str, float]:
    """Refusal rate on unanswerable questions and false-refusal rate on answerable questions
    whose passages hold the answer, at ``threshold``."""
    una = [p >= threshold for r, p in zip(rows, probs) if not r["answerable"]]
    ok = [p >= threshold for r, p in zip(rows, probs) if r["holds_answer"]]
    return {
        "refusal_rate_unanswerable": sum(una) / len(una) if una else 0.0,
        "false_refusal_rate": sum(ok) / len(ok) if ok else 0.0,
    }


def pick_threshold(rows: list[dict], probs: list[float], max_false: float) -> float:
    """The lowest threshold (most refusals) whose false-refusal rate is within ``max_false``."""
    for t in sorted(set(probs)):
        if rates(rows, probs, t)["false_refusal_rate"] <= max_false:
            return float(t)
    return 1.0


def fit(rows: list[dict], max_false: float, fitted_on: str) -> AnswerabilityModel:
    """Logistic regression of unanswerable on (dense, coverage) and, where the rows have it,
    unit; then the threshold."""
    from sklearn.linear_model import LogisticRegression

    units = all(r.get("unit") is not None for r in rows)
    x = [[r["dense"], r["coverage"], *([r["unit"]] if units else [])] for r in rows]
    y = [not r["answerable"] for r in rows]
    if len(set(y)) < 2:
        raise ValueError("--fit needs answerable and unanswerable questions (--removed-articles)")
    lr = LogisticRegression(max_iter=1000).fit(x, y)
    w, b = [round(float(v), 3) for v in lr.coef_[0]], round(float(lr.intercept_[0]), 3)
    model = AnswerabilityModel(w[0], w[1], b, 1.0, fitted_on, w[2] if units else 0.0)
    t = pick_threshold(rows, probabilities(model, rows), max_false)
    return replace(model, threshold=round(t, 3))


def load_model(path: str | None, encoder: str = "minilm", units: bool = True) -> AnswerabilityModel:
    """The model in a fitted result JSON (``--model``), or the one the product ships for
    ``encoder`` (:func:`rag.answer.answerability.model_for`; with ``units``, its model of
    three signals where there is one)."""
    if not path:
        return model_for(SimpleNamespace(name=encoder, path=None), units)
    try:
        return AnswerabilityModel(**json.loads(Path(path).read_text())["model"])
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"--model {path}: not an evals.answerability result ({e})") from e


def auc(rows: list[dict], scores: list[float]) -> float:
    """ROC AUC of ``scores`` for 'unanswerable' (scikit-learn)."""
    from sklearn.metrics import roc_auc_score

    y = [not r["answerable"] for r in rows]
    return float(roc_auc_score(y, scores)) if len(set(y)) == 2 else float("nan")


def evaluate_answerability(cfg: AnswerabilityEvalConfig, encoder=None) -> dict:
    rows = [
        r
        for r in signals(cfg, encoder)
        if r["dense"] is not None and (r["unit"] is not None or not cfg.units)
    ]
    ret = cfg.rag.retrieval
    where = f"SQuAD {cfg.split} articles, {ret.encoder}, {ret.mode} k={ret.k}"
    model = (
        fit(rows, cfg.max_false_refusal, where)
        if cfg.fit
        else load_model(cfg.model, cfg.rag.retrieval.encoder or "", cfg.units)
    )
    if model.reads_units and not cfg.units:
        raise ValueError(f"--model {cfg.model}: a model of three signals needs --units")
    probs = probabilities(model, rows)
    for r, p in zip(rows, probs):
        r["probability"] = p
    metrics = {
        **rates(rows, probs, model.threshold),
        "auc_model": auc(rows, probs),
        "auc_dense": auc(rows, [-r["dense"] for r in rows]),
        "auc_coverage": auc(rows, [-r["coverage"] for r in rows]),
        "auc_unit": auc(rows, [-r["unit"] for r in rows]) if cfg.units else None,
        "answerable": sum(r["answerable"] for r in rows),
        "unanswerable": sum(not r["answerable"] for r in rows),
    }
    return {"config": cfg.to_dict(), "model": model.to_dict(), "metrics": metrics, "rows": rows}


def _summary(cfg: AnswerabilityEvalConfig, result: dict) -> str:
    m, mod = result["metrics"], result["model"]
    return (
        f"{cfg.split}: threshold {mod['threshold']:g}: unanswerable refused "
        f"{100 * m['refusal_rate_unanswerable']:.1f}%, false refusals "
        f"{100 * m['false_refusal_rate']:.1f}% ({m['answerable']} + {m['unanswerable']} questions); "
        f"AUC model {m['auc_model']:.3f}, dense {m['auc_dense']:.3f}, coverage "
        f"{m['auc_coverage']:.3f}"
        + (f", unit {m['auc_unit']:.3f}" if m.get("auc_unit") is not None else "")
        + f"; weights dense {mod['dense_weight']:g} coverage {mod['coverage_weight']:g}"
        + (f" unit {mod['unit_weight']:g}" if mod.get("unit_weight") else "")
        + f" bias {mod['bias']:g}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = AnswerabilityEvalConfig.parser(
        "python -m evals.answerability", __doc__, required=("squad",)
    )
    return run_config_cli(
        parser,
        AnswerabilityEvalConfig,
        evaluate_answerability,
        argv,
        note=_summary,
        build=AnswerabilityEvalConfig.from_args,
    )


if __name__ == "__main__":
    raise SystemExit(main())
